"""The flow gates' settings (RATE_LIMIT, MAX_IN_FLIGHT): system-check errors for bad values,
parsed values for good ones, and the ``delayqueue_pause`` command, the stats line and the
Prometheus gauge that show a paused queue."""

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from delayqueue_django import get_queue
from delayqueue_django.checks import check_delayqueues
from delayqueue_django.core.conf.flow import parse_rate, shown_rate
from delayqueue_django.prometheus import QueueCollector
from tests.test_admin import client_for, make_user, url


def problems(settings: Any, **options: Any) -> list[tuple[str, str]]:
    settings.DELAYQUEUES = {"default": {"URL": "redis://x", **options}}
    return [(m.id or "", m.msg) for m in check_delayqueues()]


@pytest.mark.parametrize("rate", ["ten", "10", "10/d", "0/s", "-5/s", 10, "1.5/s", "2000000/s"])
def test_a_bad_rate_limit_is_a_check_error(settings: Any, rate: Any) -> None:
    assert problems(settings, RATE_LIMIT=rate) == [
        (
            "delayqueue_django.E050",
            "DELAYQUEUES['default']['RATE_LIMIT'] must be a rate like '10/s', '600/m' or "
            "'5000/h' (a whole number from 1 to 1000000 per second, minute or hour), or "
            f"None; not {rate!r}.",
        )
    ]


@pytest.mark.parametrize("cap", [0, -1, True, 2.5, "3"])
def test_a_bad_cap_is_a_check_error(settings: Any, cap: Any) -> None:
    assert problems(settings, MAX_IN_FLIGHT=cap) == [
        (
            "delayqueue_django.E051",
            "DELAYQUEUES['default']['MAX_IN_FLIGHT'] must be an int from 1 to 1000000, or "
            f"None for no cap; not {cap!r}.",
        )
    ]


def test_limits_below_one_per_shard_are_fine_on_a_sharded_queue(settings: Any) -> None:
    # One budget for the whole queue, on shard 0 (engine.flow): no shard needs a share.
    assert problems(settings, SHARDS=4, RATE_LIMIT="3/s", MAX_IN_FLIGHT=2) == []


def test_good_values_parse(settings: Any) -> None:
    assert problems(settings, RATE_LIMIT=" 600 / m", MAX_IN_FLIGHT=5) == []
    config = get_queue().config
    assert (config.rate_limit, config.max_in_flight) == ((600, 60_000), 5)
    assert [parse_rate(text) for text in ("10/s", "5000/h")] == [(10, 1000), (5000, 3_600_000)]
    assert shown_rate((600, 60_000)) == "600/m"


def test_the_pause_command_pauses_and_resumes(settings: Any) -> None:
    out = StringIO()
    call_command("delayqueue_pause", "default", stdout=out)
    assert get_queue().stats()["paused"] == 1
    call_command("delayqueue_pause", "default", "--resume", stdout=out)
    assert get_queue().stats()["paused"] == 0
    assert out.getvalue().splitlines() == ["default: paused", "default: resumed"]


def test_the_pause_command_refuses_an_unknown_queue() -> None:
    with pytest.raises(CommandError, match="nope"):
        call_command("delayqueue_pause", "nope")


def test_stats_and_metrics_show_a_paused_queue() -> None:
    get_queue().pause()
    out = StringIO()
    call_command("delayqueue_stats", "default", stdout=out)
    assert "default              paused: no worker hands out its messages" in out.getvalue()
    samples = {
        (sample.name, sample.labels.get("queue")): sample.value
        for family in QueueCollector(["default"]).collect()
        for sample in family.samples
    }
    assert samples[("delayqueue_paused", "default")] == 1


@pytest.mark.django_db
def test_the_admin_pauses_resumes_and_sets_the_rate(caplog: pytest.LogCaptureFixture) -> None:
    users = {
        "viewer": make_user("viewer", "view_queue"),
        "changer": make_user("changer", "view_queue", "change_queue"),
    }
    queue = get_queue()
    page = url("detail", "default")
    action = url("flow_action", "default")
    viewer, changer = client_for(users["viewer"]), client_for(users["changer"])
    assert 'value="pause"' not in viewer.get(page).content.decode()
    assert viewer.post(action, {"action": "pause"}).status_code == 403
    assert 'name="action" value="pause"' in changer.get(page).content.decode()
    with caplog.at_level("INFO", logger="delayqueue_django.admin"):
        response = changer.post(action, {"action": "pause"}, follow=True)
    text = response.content.decode()
    assert "Queue &#x27;default&#x27;: paused." in text
    assert "Paused: no worker hands out its messages." in text
    assert 'name="action" value="resume"' in text
    assert "admin action=flow-pause queue=default user=changer" in caplog.text
    assert queue.stats()["paused"] == 1
    changer.post(action, {"action": "resume"})
    assert queue.stats()["paused"] == 0
    response = changer.post(action, {"action": "rate", "rate": "ten"}, follow=True)
    assert "must be a rate like" in response.content.decode()
    changer.post(action, {"action": "rate", "rate": "30/m"})
    assert queue.flow().rate_limit == "30/m"
    changer.post(action, {"action": "rate", "rate": ""})
    assert queue.flow().rate_limit == ""
    # CSRF is enforced on these POSTs like on every admin action.
    strict = client_for(users["changer"], enforce_csrf_checks=True)
    assert strict.post(action, {"action": "pause"}).status_code == 403
    assert queue.stats()["paused"] == 0
