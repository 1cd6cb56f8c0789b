"""Attempt records (issue #35), the engine's contract: every refusal of a delivery writes a
record of that attempt with its verdict, at most HISTORY_ATTEMPTS a message (the newest),
read back by ``Queue.history`` and a dead letter's ``last_error``; they go when the message
goes. Run on the memory store, on Redis (single, Cluster, Valkey, scripts) and on sharded
queues."""

import os
import socket
import uuid
from collections.abc import Callable

import pytest

from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import Attempt
from delayqueue_django.engine.history import ERROR_BYTES, TRACEBACK_BYTES
from delayqueue_django.exceptions import Reject, Retry, TimeLimitExceeded
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)

WORKER = f"{socket.gethostname()}:{os.getpid()}"[-64:]


def delivered(queue: Queue, payload: object = None) -> Message:
    """A message sent and handed out (its first attempt)."""
    message_id = queue.send(payload or {"n": uuid.uuid4().hex})
    wait_for(lambda: queue.stats()["pending"] + queue.stats()["ready"] > 0, what="the send")
    [message] = [m for m in queue.fetch(10).messages if m.id == message_id]
    return message


def raised(error: BaseException) -> BaseException:
    """``error`` as a handler's: raised and caught, with its traceback."""
    try:
        raise error
    except BaseException as caught:
        return caught


def only(queue: Queue, message_id: str) -> Attempt:
    [record] = queue.history(message_id)
    return record


def test_a_message_that_never_failed_has_no_records(queue: Queue) -> None:
    message = delivered(queue)
    assert queue.history(message.id) == []
    assert queue.last_errors([message.id]) == {}
    queue.ack([message])
    assert queue.history(message.id) == []


def test_a_nack_records_the_error_its_worker_and_times(queue: Queue) -> None:
    message = delivered(queue)
    before = store_time_ms(queue)
    error = raised(ValueError("the partner said no"))
    note = queue.attempt_note(message, error, ran_seconds=0.25)
    [outcome] = queue.nack([message], delay=60, attempts={message.id: note})
    assert not outcome.exhausted
    record = only(queue, message.id)
    assert (record.attempt, record.verdict) == (1, "error")
    assert record.error_class == "builtins.ValueError"
    assert record.error == "the partner said no"
    assert record.traceback.startswith("Traceback (most recent call last):")
    assert record.traceback.rstrip().endswith("ValueError: the partner said no")
    assert record.worker == WORKER
    assert record.ended_at is not None
    assert record.started_at is not None
    assert record.ended_at.timestamp() * 1000 >= before
    ran_ms = (record.ended_at - record.started_at).total_seconds() * 1000
    assert ran_ms == pytest.approx(250, abs=1)
    assert not record.error_cut
    assert not record.traceback_cut
    assert record.damaged == ""
    assert queue.last_errors([message.id, "never-sent"]) == {message.id: record}


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (None, "nack"),
        (Retry(60, "later"), "retry"),
        (TimeLimitExceeded("time limit: ran past TIME_LIMIT"), "time limit"),
        (KeyError("id"), "error"),
    ],
)
def test_each_refusal_records_its_verdict(
    queue: Queue, error: BaseException | None, verdict: str
) -> None:
    message = delivered(queue)
    note = queue.attempt_note(message, error)
    queue.nack([message], delay=60, attempts={message.id: note})
    assert only(queue, message.id).verdict == verdict


def test_a_nack_without_a_note_records_its_verdict_alone(queue: Queue) -> None:
    message = delivered(queue)
    queue.nack([message], delay=60)
    record = only(queue, message.id)
    assert (record.attempt, record.verdict, record.error_class, record.worker) == (
        1,
        "nack",
        "",
        WORKER,
    )
    assert record.started_at is None


def test_a_reject_records_its_attempt_and_the_dead_letter_shows_it(queue: Queue) -> None:
    message = delivered(queue)
    note = queue.attempt_note(message, raised(Reject("bad order")))
    [outcome] = queue.bury([message], attempts={message.id: note})
    assert outcome.exhausted
    record = only(queue, message.id)
    assert (record.verdict, record.error) == ("reject", "bad order")
    stored = queue.peek(message.id)
    assert stored is not None
    assert stored.last_error == record
    [listed] = queue.list_messages("garbage")
    assert listed.last_error == record


def test_the_attempts_are_numbered_and_the_last_one_buries(configure: Callable[..., Queue]) -> None:
    queue = configure(RETRY_COUNT=2)
    message_id = queue.send({"n": 1})
    for _ in range(3):
        [message] = queue.fetch(1).messages
        note = queue.attempt_note(message, raised(RuntimeError(f"try {message.attempt}")))
        queue.nack([message], delay=0, attempts={message.id: note})
    records = queue.history(message_id)
    assert [(r.attempt, r.error) for r in records] == [(1, "try 1"), (2, "try 2"), (3, "try 3")]
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"
    assert stored.last_error == records[-1]


def test_a_postpone_records_the_attempt_it_gives_back(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_POSTPONES=1)
    message_id = queue.send({"n": 1})
    for _ in range(2):
        [message] = queue.fetch(1).messages
        assert message.attempt == 1  # a postpone uses no attempt
        queue.postpone([message], delay=0)
    records = queue.history(message_id)
    assert [(r.attempt, r.verdict) for r in records] == [
        (1, "postpone"),
        (1, "postponed too often"),
    ]


def test_a_retry_past_the_expiry_records_expired(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=30)
    [message] = queue.fetch(1).messages
    note = queue.attempt_note(message, Retry(3600, "much later"))
    [outcome] = queue.nack([message], delay=3600, attempts={message.id: note})
    assert outcome.dead_reason == "expired"
    record = only(queue, message_id)
    assert (record.verdict, record.error_class) == ("expired", "delayqueue_django.exceptions.Retry")


def test_a_lease_that_ran_out_records_its_attempt(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.2)
    message_id = queue.send({"n": 1})
    [first] = queue.fetch(1).messages
    until = first.deadline_ms
    wait_for(lambda: store_time_ms(queue) > until, what="the lease to run out")
    [second] = queue.fetch(1).messages
    assert second.attempt == 2
    record = only(queue, message_id)
    assert (record.attempt, record.verdict, record.worker, record.started_at) == (
        1,
        "lease expired",
        "",
        None,
    )
    assert record.ended_at is not None
    assert record.ended_at.timestamp() * 1000 == pytest.approx(until, abs=1)
    note = queue.attempt_note(second, raised(OSError("again")))
    queue.nack([second], delay=60, attempts={second.id: note})
    assert [(r.attempt, r.verdict) for r in queue.history(message_id)] == [
        (1, "lease expired"),
        (2, "error"),
    ]


def test_records_are_bounded_and_cut(configure: Callable[..., Queue]) -> None:
    queue = configure(RETRY_COUNT=1000, HISTORY_ATTEMPTS=3)
    message_id = queue.send({"n": 1})
    for n in range(5):
        [message] = queue.fetch(1).messages
        error = raised(ValueError("é" * ERROR_BYTES + str(n)))
        queue.nack([message], delay=0, attempts={message.id: queue.attempt_note(message, error)})
    records = queue.history(message_id)
    assert [r.attempt for r in records] == [3, 4, 5]
    for record in records:
        assert record.error_cut
        assert len(record.error.encode()) <= ERROR_BYTES
        assert record.error == "é" * (ERROR_BYTES // 2)
    long_tail = "\n".join(f"line {i}" for i in range(5000))
    [message] = queue.fetch(1).messages
    note = queue.attempt_note(message, ValueError(long_tail))
    queue.nack([message], delay=0, attempts={message.id: note})
    record = queue.history(message_id)[-1]
    assert record.traceback_cut
    assert len(record.traceback.encode()) <= TRACEBACK_BYTES
    assert record.traceback.endswith("line 4999\n")


def test_no_records_with_history_attempts_zero(configure: Callable[..., Queue]) -> None:
    queue = configure(HISTORY_ATTEMPTS=0, MAX_CONSUME_DURATION=0.2)
    message = delivered(queue)
    queue.nack([message], delay=0, attempts={message.id: queue.attempt_note(message, None)})
    [again] = queue.fetch(1).messages
    wait_for(lambda: store_time_ms(queue) > again.deadline_ms, what="the lease to run out")
    queue.fetch(1)
    assert queue.history(message.id) == []


@pytest.mark.parametrize("ending", ["ack", "delete", "purge", "requeue"])
def test_records_go_with_the_message(configure: Callable[..., Queue], ending: str) -> None:
    queue = configure(RETRY_COUNT=1)
    message_id = queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    queue.nack([message], delay=0)
    [message] = queue.fetch(1).messages
    assert len(queue.history(message_id)) == 1
    if ending == "ack":
        assert queue.ack([message]) == {message_id}
    else:
        queue.nack([message], delay=0)  # its retries are used up: a dead letter
        assert len(queue.history(message_id)) == 2
        if ending == "delete":
            assert queue.delete(message_id) == "garbage"
        elif ending == "purge":
            assert queue.purge_garbage() == 1
        else:
            assert queue.requeue([message_id]) == [message_id]
    assert queue.history(message_id) == []
    assert queue.check_invariants().ok


def test_a_postponed_message_acked_leaves_no_records(queue: Queue) -> None:
    message = delivered(queue)
    queue.postpone([message], delay=0)
    [again] = queue.fetch(1).messages
    assert again.attempt == 1
    assert len(queue.history(again.id)) == 1
    queue.ack([again])
    assert queue.history(again.id) == []


def test_a_cancel_of_a_waiting_retry_drops_its_records(queue: Queue) -> None:
    message = delivered(queue)
    queue.nack([message], delay=3600)
    assert len(queue.history(message.id)) == 1
    assert queue.cancel(message.id)
    assert queue.history(message.id) == []


def test_a_keyed_replace_of_a_retry_drops_its_records(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, key="order-42")
    [message] = queue.fetch(1).messages
    queue.nack([message], delay=3600)
    assert len(queue.history(message_id)) == 1
    assert queue.send({"n": 2}, key="order-42", if_exists="replace") == message_id
    assert queue.history(message_id) == []
    queue.deliver_now([message_id])
    [again] = queue.fetch(1).messages
    assert again.attempt == 1
    queue.ack([again])
    assert queue.history(message_id) == []


def test_a_superseded_retry_leaves_no_records(queue: Queue) -> None:
    first = queue.send({"n": 1}, key="order-43")
    [message] = queue.fetch(1).messages
    second = queue.send({"n": 2}, key="order-43")
    assert second != first
    [outcome] = queue.nack([message], delay=0)
    assert outcome.superseded
    assert queue.history(first) == []
    assert queue.check_invariants().ok
