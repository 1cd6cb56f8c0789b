"""The admin's "Reschedule…" action (issue #33): a waiting message's due time changed from
its list or its page, through a form asking for the new time. Staff with the change
permission only, CSRF-protected, nothing written on bad input, and a clear message."""

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.helpers import fetch_when_due, states_of, store_time_ms

pytestmark = pytest.mark.django_db

LATER = 3600


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def make_user(name: str, *permissions: str) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayqueue_django", codename=codename)
        )
    return user


def client_for(user: User | None, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


def changer(**kwargs: Any) -> Client:
    return client_for(make_user("changer", "view_queue", "change_queue"), **kwargs)


@pytest.fixture
def queue() -> Queue:
    return get_queue()


def due_ms(queue: Queue, message_id: str) -> int | None:
    stored = queue.peek(message_id)
    assert stored is not None
    return stored.score_ms


def text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def confirm(ids: list[str], state: str = "pending", **fields: str) -> dict[str, Any]:
    """The reschedule form as its page posts it back."""
    return {"action": "reschedule", "ids": ids, "state": state, "confirmed": "1", **fields}


def test_the_lists_and_the_page_of_a_waiting_message_offer_reschedule(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=LATER)
    dead, flying = queue.send({"n": 2}, retry_count=0), queue.send({"n": 3})
    deliveries = {m.id: m for m in fetch_when_due(queue, 10)}
    queue.nack([deliveries[dead]])
    assert set(deliveries) == {dead, flying}
    client = changer()
    page = client.get(url("detail", "default")).content.decode()
    assert '<option value="reschedule">Reschedule…</option>' in page
    page = client.get(url("message", "default", message_id)).content.decode()
    assert '<input type="hidden" name="action" value="reschedule">' in page
    # Not where nothing waits: dead letters, messages in flight (to one who may act on them).
    client = client_for(User.objects.create_superuser("root", password="pw"))
    for state, shown in (("garbage", dead), ("unack", flying)):
        page = client.get(url("detail", "default") + f"?state={state}").content.decode()
        assert f'value="{shown}"' in page  # (listed, with its checkbox and the actions)
        assert "reschedule" not in page, state
        page = client.get(url("message", "default", shown)).content.decode()
        assert "reschedule" not in page, state
    # Nor for a viewer.
    viewer = client_for(make_user("viewer", "view_queue"))
    assert "reschedule" not in viewer.get(url("detail", "default")).content.decode()


def test_choosing_reschedule_asks_for_the_new_time_and_changes_nothing_yet(
    queue: Queue,
) -> None:
    ids = [queue.send({"n": n}, delay=LATER) for n in range(2)]
    before = [due_ms(queue, i) for i in ids]
    next_url = url("detail", "default") + "?state=pending&page=1"
    response = changer().post(
        url("action", "default"),
        {"action": "reschedule", "ids": ids, "state": "pending", "next": next_url},
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Reschedule 2 message(s) of queue “default”" in page
    for message_id in ids:
        assert f'<input type="hidden" name="ids" value="{message_id}">' in page
    assert 'name="csrfmiddlewaretoken"' in page
    assert 'name="delay"' in page
    assert 'name="at"' in page
    assert f'<input type="hidden" name="next" value="{html.escape(next_url)}">' in page
    assert [due_ms(queue, i) for i in ids] == before


def test_a_delay_reschedules_the_selected_messages_and_says_so(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    soon = queue.send({"n": 1}, delay=LATER)
    other = queue.send({"n": 2}, delay=LATER)
    gone = queue.send({"n": 3})
    [delivery] = fetch_when_due(queue)
    assert delivery.id == gone
    before = store_time_ms(queue)
    with caplog.at_level("INFO", logger="delayqueue_django.admin"):
        response = changer().post(
            url("action", "default"), confirm([soon, gone], delay="120"), follow=True
        )
    said = text(response.content.decode())
    assert (
        "Reschedule: 1 of 2 message(s) in queue 'default', due in 120 s. "
        "The others were no longer waiting (in flight, dead or gone)."
    ) in said
    due = due_ms(queue, soon)
    assert due is not None
    assert before + 120_000 <= due <= store_time_ms(queue) + 120_000
    untouched = due_ms(queue, other)
    assert untouched is not None
    assert untouched > before + 3_000_000
    assert states_of(queue, gone) == ["unack"]
    assert f"admin action=reschedule queue=default user=changer ids={soon},{gone} done=1" in (
        caplog.text
    )


def test_a_time_reschedules_to_that_time(queue: Queue, settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    message_id = queue.send({"n": 1}, delay=LATER)
    at = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    local = at.astimezone(ZoneInfo("Europe/Paris"))
    response = changer().post(
        url("action", "default"),
        confirm([message_id], at=local.strftime("%Y-%m-%dT%H:%M:%S")),
        follow=True,
    )
    assert "Reschedule: 1 of 1 message(s) in queue" in text(response.content.decode())
    assert due_ms(queue, message_id) == int(at.timestamp() * 1000)


def test_a_staged_message_can_be_rescheduled_from_the_ready_list(queue: Queue) -> None:
    message_id = queue.send({"n": 1})
    queue.fetch(0)
    assert states_of(queue, message_id) == ["ready"]
    changer().post(url("action", "default"), confirm([message_id], "ready", delay="600"))
    assert states_of(queue, message_id) == ["pending"]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "Give a delay or a time."),
        ({"delay": "60", "at": "2099-01-01T00:00"}, "Give a delay or a time, not both."),
        ({"delay": "soon"}, "Enter a number."),
        ({"delay": "-5"}, "Ensure this value is greater than or equal to 0."),
        ({"delay": "nan"}, "Enter a number."),
        ({"delay": "1e300"}, "delay is too far in the future"),
        ({"at": "tomorrow"}, "Enter a valid date/time."),
        ({"at": "2001-01-01T00:00"}, "That time has passed"),
    ],
)
def test_bad_input_writes_nothing_and_says_why_on_the_form(
    queue: Queue, fields: dict[str, str], error: str
) -> None:
    message_id = queue.send({"n": 1}, delay=LATER)
    before = due_ms(queue, message_id)
    response = changer().post(url("action", "default"), confirm([message_id], **fields))
    assert response.status_code == 200
    page = text(response.content.decode())
    assert error in page
    assert "Reschedule 1 message(s) of queue “default”" in page  # the form again, to correct
    assert due_ms(queue, message_id) == before


def test_reschedule_needs_the_change_permission(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=LATER)
    before = due_ms(queue, message_id)
    for user in (
        make_user("viewer", "view_queue"),
        make_user("deleter", "view_queue", "delete_queue"),
        make_user("staff"),
    ):
        client = client_for(user)
        for data in (
            {"action": "reschedule", "ids": [message_id], "state": "pending"},
            confirm([message_id], delay="0"),
        ):
            assert client.post(url("action", "default"), data).status_code == 403
    response = Client().post(url("action", "default"), confirm([message_id], delay="0"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert due_ms(queue, message_id) == before


def test_reschedule_is_protected_against_csrf(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=LATER)
    before = due_ms(queue, message_id)
    client = changer(enforce_csrf_checks=True)
    assert client.post(url("action", "default"), confirm([message_id], delay="0")).status_code == (
        403
    )
    assert due_ms(queue, message_id) == before
    # The form's own token: the confirmation page carries it.
    form = client.get(url("message", "default", message_id)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token is not None
    asked = client.post(
        url("action", "default"),
        {
            "action": "reschedule",
            "ids": [message_id],
            "state": "pending",
            "csrfmiddlewaretoken": token.group(1),
        },
    )
    assert asked.status_code == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', asked.content.decode())
    assert token is not None
    done = client.post(
        url("action", "default"),
        {**confirm([message_id], delay="0"), "csrfmiddlewaretoken": token.group(1)},
    )
    assert done.status_code == 302
    assert due_ms(queue, message_id) != before


def test_reschedule_refuses_a_state_where_nothing_waits(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=LATER)
    before = due_ms(queue, message_id)
    response = changer().post(
        url("action", "default"), confirm([message_id], "garbage", delay="0"), follow=True
    )
    assert "The form does not say which messages you saw." in text(response.content.decode())
    assert due_ms(queue, message_id) == before


def test_ids_and_keys_on_the_form_are_escaped(queue: Queue) -> None:
    odd = '<script>alert("id")</script>'
    page = changer().post(
        url("action", "default"), {"action": "reschedule", "ids": [odd], "state": "pending"}
    )
    assert odd not in page.content.decode()
    assert html.escape(odd) in page.content.decode()
