"""SCHEDULES in settings: parsed into the queue's config with their defaults, and every
problem reported by a system check (E040-E049) with its exact message."""

from datetime import timedelta
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.checks import check_delayqueues, check_schedule_tasks
from delayqueue_django.core import conf
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.option import declared_schedules

BACKEND = "delayqueue_django.tasks.DelayQueueBackend"
WHERE = "DELAYQUEUES['default']['SCHEDULES']"


def problems(schedules: Any, settings: Any, **options: Any) -> list[tuple[str, str]]:
    settings.DELAYQUEUES = {"default": {"URL": "memory://", "SCHEDULES": schedules, **options}}
    return [(m.id or "", m.msg) for m in check_delayqueues()]


def test_schedules_are_parsed_with_their_defaults(settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Berlin"
    settings.DELAYQUEUES = {
        "default": {
            "URL": "memory://",
            "SCHEDULES": {
                "nightly-report": {"CRON": "0 3 * * *", "PAYLOAD": {"report": "sales"}},
                "poll": {
                    "EVERY": timedelta(minutes=5),
                    "MISSED": "all",
                    "MISSED_AFTER": 600,
                    "MISSED_LIMIT": 12,
                },
                "utc": {"CRON": "30 2 * * MON", "TIME_ZONE": "UTC", "MISSED": "skip"},
            },
        }
    }
    assert check_delayqueues() == []
    nightly, poll, utc = declared_schedules(get_queue().config)
    assert (nightly.name, nightly.cron, nightly.every_ms) == ("nightly-report", "0 3 * * *", None)
    assert nightly.time_zone == "Europe/Berlin"  # settings.TIME_ZONE
    assert nightly.payload == '{"report":"sales"}'
    assert (nightly.missed, nightly.missed_after_ms, nightly.source) == ("once", 60_000, "settings")
    assert nightly.missed_limit == 100
    assert (poll.every_ms, poll.time_zone, poll.payload) == (300_000, "UTC", "null")
    assert (poll.missed, poll.missed_after_ms, poll.missed_limit) == ("all", 600_000, 12)
    assert (utc.time_zone, utc.missed) == ("UTC", "skip")


def test_a_queue_without_schedules_has_none(settings: Any) -> None:
    assert conf.DEFAULTS["SCHEDULES"] == {}
    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    assert declared_schedules(get_queue().config) == ()


def test_a_changed_definition_has_another_fingerprint(settings: Any) -> None:
    def fingerprint(**options: Any) -> str:
        settings.DELAYQUEUES = {"default": {"URL": "memory://", "SCHEDULES": {"a": options}}}
        [schedule] = declared_schedules(conf.queue_configs()["default"])
        return schedule.fingerprint

    base = fingerprint(CRON="0 3 * * *", PAYLOAD=1)
    assert fingerprint(CRON="0 3 * * *", PAYLOAD=1) == base
    others = {
        fingerprint(CRON="0 4 * * *", PAYLOAD=1),
        fingerprint(CRON="0 3 * * *", PAYLOAD=2),
        fingerprint(CRON="0 3 * * *", PAYLOAD=1, TIME_ZONE="Asia/Tokyo"),
        fingerprint(CRON="0 3 * * *", PAYLOAD=1, MISSED="all"),
        fingerprint(CRON="0 3 * * *", PAYLOAD=1, MISSED="all", MISSED_LIMIT=5),
        fingerprint(EVERY=10, PAYLOAD=1),
    }
    assert base not in others
    assert len(others) == 6


def test_a_definition_stored_before_missed_limit_keeps_its_fingerprint() -> None:
    # As an earlier version stored it, and the fingerprint it stored with it: workers
    # comparing the two would otherwise write none of its ticks.
    stored = (
        '{"args":[],"cron":null,"every_ms":1000,"kwargs":{},"missed":"all",'
        '"missed_after_ms":60000,"payload":"null","source":"api","task":null,"time_zone":"UTC"}'
    )
    schedule = Schedule.from_json("poll", stored)
    assert (schedule.missed_limit, schedule.fingerprint) == (100, "3a112e19ca64c56b")


@pytest.mark.parametrize(
    ("schedules", "expected"),
    [
        (
            ["nightly"],
            ("E040", f"{WHERE} must be a dict of schedules by name, not list."),
        ),
        (
            {"bad name": {"EVERY": 5}},
            (
                "E040",
                f"{WHERE}['bad name'] has an invalid name: a schedule's name is 1 to 100 letters, digits and _ . : -",
            ),
        ),
        (
            {"nightly": "0 3 * * *"},
            (
                "E040",
                f"{WHERE}['nightly'] must be a dict of options (CRON or EVERY, PAYLOAD, ...), not str.",
            ),
        ),
        (
            {"nightly": {"CRON": "0 3 * * *", "PAYLAOD": 1}},
            (
                "E041",
                f"{WHERE}['nightly'] has unknown option(s) 'PAYLAOD'; the options are CRON, EVERY, PAYLOAD, TIME_ZONE, MISSED, MISSED_AFTER, MISSED_LIMIT, TASK, ARGS, KWARGS.",
            ),
        ),
        (
            {"nightly": {"CRON": "0 3 * * *", "EVERY": 60}},
            (
                "E042",
                f"{WHERE}['nightly'] must set exactly one of CRON (a cron expression) and EVERY (seconds or a timedelta).",
            ),
        ),
        (
            {"nightly": {"PAYLOAD": 1}},
            (
                "E042",
                f"{WHERE}['nightly'] must set exactly one of CRON (a cron expression) and EVERY (seconds or a timedelta).",
            ),
        ),
        (
            {"nightly": {"CRON": "0 3 * *"}},
            (
                "E043",
                f"{WHERE}['nightly']['CRON'] is '0 3 * *', which is not a valid cron expression: Wrong number of fields.",
            ),
        ),
        (
            {"nightly": {"CRON": "61 3 * * *"}},
            (
                "E043",
                f"{WHERE}['nightly']['CRON'] is '61 3 * * *', which is not a valid cron expression: Bad minute.",
            ),
        ),
        (
            {"nightly": {"CRON": "* * */20 * 1L"}},
            (
                "E043",
                f"{WHERE}['nightly']['CRON'] is '* * */20 * 1L', which never fires (no time matches it in the next 50 years).",
            ),
        ),
        (
            {"nightly": {"CRON": 3}},
            ("E043", f"{WHERE}['nightly']['CRON'] must be a cron expression, not 3."),
        ),
        (
            {"poll": {"EVERY": 0.5}},
            (
                "E044",
                f"{WHERE}['poll']['EVERY'] must be at least one second and at most 50 years (a number or a timedelta), not 0.5.",
            ),
        ),
        (
            {"poll": {"EVERY": "5m"}},
            (
                "E044",
                f"{WHERE}['poll']['EVERY'] must be at least one second and at most 50 years (a number or a timedelta), not '5m'.",
            ),
        ),
        (
            # Its ticks would soon be past the year 9999, which no datetime holds.
            {"poll": {"EVERY": 1e12}},
            (
                "E044",
                f"{WHERE}['poll']['EVERY'] must be at least one second and at most 50 years (a number or a timedelta), not 1000000000000.0.",
            ),
        ),
        (
            {"nightly": {"CRON": "0 3 * * *", "TIME_ZONE": "Europe/Atlantis"}},
            (
                "E045",
                f"{WHERE}['nightly']['TIME_ZONE'] is 'Europe/Atlantis', which is not a time zone this system knows.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "TIME_ZONE": "Europe/Berlin"}},
            (
                "E045",
                f"{WHERE}['poll'] sets TIME_ZONE with EVERY; ticks every N seconds fall at multiples of N since the Unix epoch, whatever the zone. Use CRON for a time of day.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED": "twice"}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED'] must be one of 'skip', 'once', 'all', not 'twice'.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED_AFTER": -1}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED_AFTER'] must be seconds (a number or a timedelta, zero or more), not -1.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED": "all", "MISSED_LIMIT": 0}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED_LIMIT'] must be a whole number from 1 to 10,000, not 0.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED": "all", "MISSED_LIMIT": 10_001}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED_LIMIT'] must be a whole number from 1 to 10,000, not 10001.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED": "all", "MISSED_LIMIT": 2.5}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED_LIMIT'] must be a whole number from 1 to 10,000, not 2.5.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED": "all", "MISSED_LIMIT": True}},
            (
                "E046",
                f"{WHERE}['poll']['MISSED_LIMIT'] must be a whole number from 1 to 10,000, not True.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "MISSED_LIMIT": 5}},
            (
                "E046",
                f"{WHERE}['poll'] sets MISSED_LIMIT with MISSED 'once'; it bounds the missed ticks that MISSED 'all' runs ('once' runs one, 'skip' none).",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "PAYLOAD": {"tags": {"a"}}}},
            (
                "E047",
                f"{WHERE}['poll']['PAYLOAD'] cannot be sent: payload for queue 'default' is not JSON serializable: Object of type set is not JSON serializable.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "TASK": "report"}},
            (
                "E048",
                f"{WHERE}['poll']['TASK'] must be the dotted path of a task, like 'shop.tasks.report'; not 'report'.",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "TASK": "shop.tasks.report", "PAYLOAD": 1}},
            (
                "E048",
                f"{WHERE}['poll'] sets both TASK and PAYLOAD; a task's tick carries its call (ARGS and KWARGS).",
            ),
        ),
        (
            {"poll": {"EVERY": 60, "ARGS": [1]}},
            ("E048", f"{WHERE}['poll'] sets ARGS or KWARGS without TASK."),
        ),
        (
            {"poll": {"EVERY": 60, "TASK": "shop.tasks.report", "KWARGS": [1]}},
            (
                "E048",
                f"{WHERE}['poll']['ARGS'] must be a list and {WHERE}['poll']['KWARGS'] a dict.",
            ),
        ),
    ],
)
def test_each_problem_has_its_id_and_message(
    schedules: Any, expected: tuple[str, str], settings: Any
) -> None:
    check_id, message = expected
    assert problems(schedules, settings) == [(f"delayqueue_django.{check_id}", message)]


def test_a_payload_larger_than_the_queue_takes_is_refused(settings: Any) -> None:
    schedules = {"poll": {"EVERY": 60, "PAYLOAD": "x" * 100}}
    assert problems(schedules, settings, MAX_PAYLOAD_BYTES=50) == [
        (
            "delayqueue_django.E047",
            f"{WHERE}['poll']['PAYLOAD'] cannot be sent: payload for queue 'default' is 102 bytes encoded; MAX_PAYLOAD_BYTES is 50.",
        )
    ]


def test_every_bad_schedule_is_reported_and_using_the_queue_raises(settings: Any) -> None:
    schedules = {"a": {"CRON": "bad"}, "b": {"EVERY": 0}, "c": {"EVERY": 5}}
    assert [check_id for check_id, _ in problems(schedules, settings)] == [
        "delayqueue_django.E043",
        "delayqueue_django.E044",
    ]
    with pytest.raises(QueueConfigurationError, match=r"E043: .*'bad'"):
        get_queue()


def test_task_queues_schedule_tasks_and_other_queues_payloads(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "tasks": {
            "URL": "memory://",
            "SCHEDULES": {"a": {"EVERY": 5}, "b": {"EVERY": 5, "TASK": "x.y"}},
        },
        "plain": {
            "URL": "memory://",
            "SCHEDULES": {"c": {"EVERY": 5, "TASK": "x.y"}, "d": {"EVERY": 5}},
        },
    }
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["tasks"]}}
    assert [(m.id, m.msg) for m in check_schedule_tasks()] == [
        (
            "delayqueue_django.E049",
            "DELAYQUEUES['tasks']['SCHEDULES']['a'] has no TASK, but a DelayQueueBackend in TASKS carries queue 'tasks': its messages are run as tasks.",
        ),
        (
            "delayqueue_django.E049",
            "DELAYQUEUES['plain']['SCHEDULES']['c'] names TASK 'x.y', but no DelayQueueBackend in TASKS carries queue 'plain'.",
        ),
    ]
