"""Attempt records around the engine (issue #35): the settings' checks, handlers run as the
worker runs them (each refusal's verdict and error in its record), ``ahistory``, and the
time limit's hard stop."""

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from delayqueue_django import Postpone, Retry, get_queue
from delayqueue_django.checks import check_delayqueues, check_history_redact
from delayqueue_django.core.message import Message
from delayqueue_django.exceptions import Reject
from delayqueue_django.testing import MemoryQueues, memory_queues
from delayqueue_django.worker.time_limits import refuse_over_time

not_callable = 42


def handle(message: Message) -> Any:
    action = message.payload["do"]
    if action == "false":
        return False
    if action == "retry":
        raise Retry(0, "the partner is busy")
    if action == "reject":
        raise Reject("no such order")
    if action == "postpone":
        raise Postpone(0)
    raise LookupError(f"order {message.payload['n']} not found")


@pytest.fixture
def queues(settings: Any) -> Iterator[MemoryQueues]:
    settings.DELAYQUEUES = {
        "default": {
            "REDIS": "redis",
            "HANDLER": "tests.test_history_api.handle",
            "RETRY_COUNT": 1,
            "NACK_REDELIVERY_DELAY": 0,
            "MAX_POSTPONES": 1,
        },
    }
    with memory_queues() as queues:
        yield queues


@pytest.mark.parametrize(
    ("do", "verdicts", "error_class"),
    [
        ("raise", ["error", "error"], "builtins.LookupError"),
        ("false", ["nack", "nack"], ""),
        ("retry", ["retry", "retry"], "delayqueue_django.exceptions.Retry"),
        ("reject", ["reject"], "delayqueue_django.exceptions.Reject"),
        ("postpone", ["postpone", "postponed too often"], "delayqueue_django.exceptions.Postpone"),
    ],
)
def test_handlers_run_by_the_worker_leave_their_records(
    queues: MemoryQueues, do: str, verdicts: list[str], error_class: str
) -> None:
    queue = get_queue()
    message_id = queue.send({"do": do, "n": 42})
    outcomes = queues.run_due()
    records = queue.history(message_id)
    assert [r.verdict for r in records] == verdicts
    assert {r.error_class for r in records} == {error_class}
    assert [r.attempt for r in records] == [o.message.attempt for o in outcomes]
    for record, outcome in zip(records, outcomes, strict=True):
        assert record.started_at is not None
        assert record.ended_at is not None
        assert record.started_at <= record.ended_at
        assert record.ended_at - record.started_at <= timedelta(seconds=outcome.seconds + 0.01)
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"
    assert stored.last_error == records[-1]
    if do == "raise":
        assert records[-1].error == "order 42 not found"
        assert "in handle" in records[-1].traceback


def test_the_hard_time_limit_records_its_attempt(queues: MemoryQueues) -> None:
    queue = get_queue()
    message_id = queue.send({"do": "raise", "n": 1})
    [message] = queue.fetch(1).messages
    refuse_over_time(message, 0.3, 0.31)
    [record] = queue.history(message_id)
    assert (record.attempt, record.verdict) == (1, "time limit")
    assert record.error_class == "delayqueue_django.exceptions.TimeLimitExceeded"
    assert "TIME_LIMIT (0.3 s)" in record.error


def test_ahistory_is_history_for_async_code(queues: MemoryQueues) -> None:
    queue = get_queue()
    message_id = queue.send({"do": "false", "n": 1})
    queues.run_due()
    assert asyncio.run(queue.ahistory(message_id)) == queue.history(message_id)


def test_bad_history_options_are_check_errors(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "a": {"REDIS": "redis", "HISTORY_ATTEMPTS": -1},
        "b": {"REDIS": "redis", "HISTORY_ATTEMPTS": 101},
        "c": {"REDIS": "redis", "HISTORY_ATTEMPTS": True},
        "d": {"REDIS": "redis", "HISTORY_REDACT": "not a path"},
        "fine": {"REDIS": "redis", "HISTORY_ATTEMPTS": 0, "HISTORY_REDACT": None},
    }
    found = [(error.id, error.msg) for error in check_delayqueues()]
    assert found == [
        (
            "delayqueue_django.E085",
            "DELAYQUEUES['a']['HISTORY_ATTEMPTS'] must be an int from 0 to 100, not -1.",
        ),
        (
            "delayqueue_django.E085",
            "DELAYQUEUES['b']['HISTORY_ATTEMPTS'] must be an int from 0 to 100, not 101.",
        ),
        (
            "delayqueue_django.E085",
            "DELAYQUEUES['c']['HISTORY_ATTEMPTS'] must be an int from 0 to 100, not True.",
        ),
        (
            "delayqueue_django.E086",
            "DELAYQUEUES['d']['HISTORY_REDACT'] must be the dotted path of a callable, like "
            "'shop.history.redact', or None; not 'not a path'.",
        ),
    ]


def test_a_history_redact_that_does_not_import_is_a_check_error(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "gone": {"REDIS": "redis", "HISTORY_REDACT": "tests.no_such_module.redact"},
        "value": {"REDIS": "redis", "HISTORY_REDACT": "tests.test_history_api.not_callable"},
        "fine": {"REDIS": "redis", "HISTORY_REDACT": "tests.test_history_api.handle"},
    }
    found = [(error.id, error.msg) for error in check_history_redact()]
    assert [error_id for error_id, _ in found] == ["delayqueue_django.E087"] * 2
    assert "'tests.no_such_module.redact' could not be imported: ModuleNotFoundError" in found[0][1]
    assert "'tests.test_history_api.not_callable' is a int, not a callable" in found[1][1]


async def handle_async(message: Message) -> None:
    await asyncio.sleep(0)
    raise ConnectionError(f"partner down for order {message.payload['n']}")


def test_an_async_handler_leaves_its_records(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "REDIS": "redis",
            "HANDLER": "tests.test_history_api.handle_async",
            "RETRY_COUNT": 0,
        },
    }
    with memory_queues() as queues:
        queue = get_queue()
        message_id = queue.send({"n": 7})
        queues.run_due()
        [record] = queue.history(message_id)
        assert (record.verdict, record.error_class, record.error) == (
            "error",
            "builtins.ConnectionError",
            "partner down for order 7",
        )
        assert "in handle_async" in record.traceback
