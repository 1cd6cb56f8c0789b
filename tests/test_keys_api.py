"""Keys through the public API (issue #26): send, send_many, asend and on_commit sends with a
key, cancel, reschedule and lookup by key and by id, and the key as handlers, signals and
the testing helpers see it. The stores' own rules are proven by the engine's contract
tests; these prove what the API adds: validation with nothing written, the ids returned,
and the key carried to wherever a message shows up."""

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

import delayqueue_django as delayqueue
from delayqueue_django import Outgoing, signals
from delayqueue_django.core import features
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.queue.key_options import unique_ms
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.keyed import KEY_MAX_BYTES
from delayqueue_django.exceptions import (
    ConflictingOptions,
    DuplicateKey,
    InvalidKey,
    InvalidKeyOption,
)
from delayqueue_django.testing import memory_queues
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler
from tests.backends import one_shard
from tests.helpers import fetch_when_due, store_time_ms
from tests.test_doc_snippets import snippet

LATER = 60  # seconds: a message that stays pending for the whole test


def stored_count(queue: Queue) -> int:
    stats = queue.stats()
    return sum(stats[state] for state in ("pending", "ready", "retry", "unack", "garbage"))


# Validation: every bad option refused with a clear error, and nothing written.

BAD_KEYS = [
    pytest.param(42, "must be a str", id="int"),
    pytest.param(b"order-1", "must be a str", id="bytes"),
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("k" * (KEY_MAX_BYTES + 1), "257 bytes", id="too-long"),
    # 129 two-byte characters: 129 characters, but 258 bytes in UTF-8.
    pytest.param("é" * 129, "258 bytes", id="too-many-bytes"),
    pytest.param("order-\ud800", "lone surrogate", id="surrogate"),
]


@pytest.mark.parametrize(("key", "message"), BAD_KEYS)
def test_a_bad_key_is_refused_and_nothing_is_written(queue: Queue, key: Any, message: str) -> None:
    with pytest.raises(InvalidKey, match=message):
        queue.send("x", key=key)
    with pytest.raises(InvalidKey, match=message):
        queue.send_many(["plain", Outgoing("keyed", key=key)])
    with pytest.raises(InvalidKey, match=message):
        queue.cancel(key=key)
    with pytest.raises(InvalidKey, match=message):
        queue.reschedule(key=key)
    with pytest.raises(InvalidKey, match=message):
        queue.lookup(key)
    assert stored_count(queue) == 0


def test_the_longest_key_is_taken_whatever_its_characters(queue: Queue) -> None:
    key = "é" * (KEY_MAX_BYTES // 2)  # 256 bytes: the bound is in bytes of UTF-8
    message_id = queue.send("x", key=key, delay=LATER)
    found = queue.lookup(key)
    assert found is not None
    assert (found.id, found.key) == (message_id, key)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"key": "k", "if_exists": "skip"},
            InvalidKeyOption,
            "^if_exists must be 'keep', 'replace' or 'error', not 'skip'$",
        ),
        (
            {"key": "k", "if_exists": "replce"},
            InvalidKeyOption,
            "^if_exists must be 'keep', 'replace' or 'error', not 'replce': did you mean "
            "'replace'\\?$",
        ),
        ({"if_exists": "replace"}, ConflictingOptions, "if_exists applies"),
        ({"unique_for": 60}, ConflictingOptions, "unique_for applies"),
        ({"key": "k", "unique_for": 0}, InvalidKeyOption, "more than 0"),
        ({"key": "k", "unique_for": -1}, InvalidKeyOption, "more than 0"),
        ({"key": "k", "unique_for": timedelta(0)}, InvalidKeyOption, "more than 0"),
        ({"key": "k", "unique_for": float("nan")}, InvalidKeyOption, "finite"),
        ({"key": "k", "unique_for": float("inf")}, InvalidKeyOption, "finite"),
        ({"key": "k", "unique_for": True}, InvalidKeyOption, "not bool"),
        ({"key": "k", "unique_for": "60"}, InvalidKeyOption, "not str"),
        ({"key": "k", "unique_for": 10**400}, InvalidKeyOption, "too long"),
    ],
)
def test_bad_key_options_are_refused_and_nothing_is_written(
    queue: Queue, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        queue.send("x", **options)
    with pytest.raises(error, match=message):
        queue.send_many([Outgoing("plain"), Outgoing("keyed", **options)])
    with pytest.raises(error, match=message):
        delayqueue.send("x", **options)
    assert stored_count(queue) == 0


def test_a_bad_key_option_is_still_an_invalid_key_and_a_value_error() -> None:
    """What code written before InvalidKeyOption catches, it still catches."""
    assert issubclass(InvalidKeyOption, InvalidKey)
    assert issubclass(InvalidKeyOption, ValueError)


def test_the_keys_guides_first_example_runs_as_pasted(settings: Any) -> None:
    """It used timedelta without importing it."""
    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    with memory_queues() as queues:
        exec(snippet("keys-first"), {})
        [sent] = queues.sent()
        assert (sent.key, sent.delay) == ("order-42-expiry", timedelta(minutes=30))
        assert delayqueue.get_queue().lookup("order-42-expiry") is None  # cancelled


@pytest.mark.parametrize(
    ("unique_for", "ms"),
    [
        (5, 5000),
        (0.007, 7),  # 0.00699999... as a float: not 8 ms
        (0.0011, 2),  # rounded up
        (timedelta(microseconds=1), 1),
        (timedelta(minutes=1, microseconds=1001), 60_002),
    ],
)
def test_unique_for_is_whole_ms_rounded_up(unique_for: Any, ms: int) -> None:
    assert unique_ms(unique_for) == ms


def test_cancel_and_reschedule_take_an_id_or_a_key(queue: Queue) -> None:
    for call in (queue.cancel, queue.reschedule):
        with pytest.raises(TypeError, match="needs a message id or key="):
            call()
        with pytest.raises(ConflictingOptions, match="not both"):
            call("some-id", key="k")


# Sending with a key: the id returned is the one the key names.


def test_keep_returns_the_waiting_message_and_leaves_it_as_it_was(queue: Queue) -> None:
    first = queue.send({"v": 1}, key="order-1", delay=LATER)
    before = queue.peek(first)
    assert queue.send({"v": 2}, key="order-1") == first
    after = queue.peek(first)
    assert before is not None
    assert after is not None
    assert (after.payload, after.score_ms, after.key) == ('{"v":1}', before.score_ms, "order-1")
    assert stored_count(queue) == 1


def test_replace_gives_the_waiting_message_the_new_payload_and_due_time(queue: Queue) -> None:
    first = queue.send({"v": 1}, key="digest", delay=LATER, retry_count=1)
    assert queue.send({"v": 2}, key="digest", if_exists="replace", delay=2 * LATER) == first
    found = queue.peek(first)
    assert found is not None
    assert found.payload == '{"v":2}'
    assert found.score_ms is not None
    assert found.score_ms >= store_time_ms(queue) + (2 * LATER - 1) * 1000
    assert stored_count(queue) == 1


def test_error_raises_duplicate_key_naming_the_key_and_the_message(queue: Queue) -> None:
    first = queue.send("x", key="order-1", delay=LATER)
    with pytest.raises(DuplicateKey) as raised:
        queue.send("y", key="order-1", if_exists="error")
    assert (raised.value.key, raised.value.message_id) == ("order-1", first)
    assert "order-1" in str(raised.value)
    assert first in str(raised.value)
    assert stored_count(queue) == 1


def test_a_single_sends_refusal_says_nothing_was_written_not_its_batch(queue: Queue) -> None:
    """A send has no batch to speak of: its refusal said "nothing in its batch was
    written", as send_many's does."""
    first = queue.send("x", key="order-1", delay=LATER)
    said = f"key 'order-1' names the waiting message {first!r}; nothing was written"
    with pytest.raises(DuplicateKey) as raised:
        queue.send("y", key="order-1", if_exists="error")
    assert str(raised.value) == said
    with pytest.raises(DuplicateKey) as raised:
        asyncio.run(queue.asend("y", key="order-1", if_exists="error"))
    assert str(raised.value) == said
    with pytest.raises(DuplicateKey) as raised:
        queue.send_many([Outgoing("y", key="order-1", if_exists="error")])
    assert str(raised.value).endswith("; nothing in its batch was written")
    assert stored_count(queue) == 1


def test_a_key_whose_message_is_in_flight_is_free_again(queue: Queue) -> None:
    first = queue.send("x", key="order-1")
    [delivery] = fetch_when_due(queue)
    assert (delivery.id, delivery.key) == (first, "order-1")
    second = queue.send("y", key="order-1", delay=LATER)
    assert second != first
    found = queue.lookup("order-1")
    assert found is not None
    assert found.id == second


def test_a_replace_while_the_keys_message_runs_is_a_new_message_that_may_run_beside_it(
    queue: Queue,
) -> None:
    """What the keys guide says: the running delivery cannot be changed, so the replace
    creates a new message, which is handed out when due, the first one still running."""
    first = queue.send({"v": 1}, key="sync:42")
    [running] = fetch_when_due(queue)
    second = queue.send({"v": 2}, key="sync:42", if_exists="replace")
    assert second != first
    [beside] = fetch_when_due(queue)
    assert (running.id, beside.id) == (first, second)  # both in flight at once
    queue.ack([running, beside])


@one_shard
def test_a_replace_grouped_by_its_key_waits_for_the_running_message(queue: Queue) -> None:
    """The keys guide's pattern for "after": a group named as the key holds the new message
    until the running one is acked."""
    first = queue.send({"v": 1}, key="sync:42", group="sync:42")
    [running] = fetch_when_due(queue)
    second = queue.send({"v": 2}, key="sync:42", if_exists="replace", group="sync:42")
    assert second != first
    assert queue.fetch().messages == []  # held by its group
    queue.ack([running])
    [after] = fetch_when_due(queue)
    assert (after.id, after.payload) == (second, {"v": 2})


def test_unique_for_holds_the_key_after_a_cancel_until_it_ends(queue: Queue) -> None:
    first = queue.send("x", key="pay-7", unique_for=0.5, delay=LATER)
    assert queue.cancel(key="pay-7") is True
    # The hold is about sends: the message is gone, the key still taken.
    assert queue.send("y", key="pay-7", delay=LATER) == first
    with pytest.raises(DuplicateKey) as raised:
        queue.send("y", key="pay-7", if_exists="error")
    assert raised.value.message_id == first
    assert stored_count(queue) == 0
    time.sleep(0.6)
    second = queue.send("z", key="pay-7", delay=LATER)
    assert second != first
    assert stored_count(queue) == 1


def test_send_many_takes_keys_per_item_and_returns_the_ids_they_name(queue: Queue) -> None:
    waiting = queue.send("old", key="a", delay=LATER)
    ids = queue.send_many(
        [
            "plain",
            Outgoing("kept", key="a"),
            Outgoing("new", key="b", delay=LATER),
            Outgoing("same batch", key="b", if_exists="replace", delay=LATER),
        ]
    )
    assert ids[1] == waiting
    assert ids[2] == ids[3]  # the second item saw the first
    assert len({ids[0], ids[1], ids[2]}) == 3
    replaced = queue.peek(ids[2])
    assert replaced is not None
    assert replaced.payload == '"same batch"'
    assert stored_count(queue) == 3


def test_a_refusal_in_send_many_leaves_its_unkeyed_items_unwritten(queue: Queue) -> None:
    """The keyed items go first: a refusal stops the call before its plain items."""
    queue.send("old", key="a", delay=LATER)
    with pytest.raises(DuplicateKey):
        queue.send_many(["plain", Outgoing("refused", key="a", if_exists="error")])
    assert stored_count(queue) == 1


@one_shard  # (a sharded queue's refusal refuses its own shard's part only)
def test_a_refused_key_in_send_many_writes_nothing_of_the_call(queue: Queue) -> None:
    queue.send("old", key="a", delay=LATER)
    with pytest.raises(DuplicateKey):
        queue.send_many(
            ["plain", Outgoing("new", key="b"), Outgoing("refused", key="a", if_exists="error")]
        )
    assert stored_count(queue) == 1
    assert queue.lookup("b") is None


def test_the_module_level_send_takes_a_key(queue: Queue) -> None:
    first = delayqueue.send("x", key="order-1", delay=LATER)
    assert delayqueue.send("y", key="order-1", if_exists="replace", delay=LATER) == first
    found = queue.lookup("order-1")
    assert found is not None
    assert found.payload == '"y"'


def test_asend_takes_a_key(queue: Queue) -> None:
    async def scenario() -> tuple[str, str, str]:
        first = await queue.asend("x", key="order-1", delay=LATER)
        kept = await delayqueue.asend("y", key="order-1", delay=LATER)
        [many] = await queue.asend_many([Outgoing("z", key="order-1")])
        return first, kept, many

    first, kept, many = asyncio.run(scenario())
    assert first == kept == many
    assert stored_count(queue) == 1


@pytest.mark.django_db(transaction=True)
def test_an_on_commit_send_with_a_key_is_decided_at_the_commit(queue: Queue) -> None:
    with transaction.atomic():
        created = queue.send("x", key="order-1", on_commit=True, delay=LATER)
        assert queue.lookup("order-1") is None  # not yet sent
    found = queue.lookup("order-1")
    assert found is not None
    assert found.id == created
    with transaction.atomic():
        # The key's outcome is not known yet: the id returned is the new message's.
        kept = queue.send("y", key="order-1", on_commit=True)
    assert kept != created
    assert queue.peek(kept) is None  # the key kept its message: nothing under the new id
    found = queue.lookup("order-1")
    assert found is not None
    assert (found.id, found.payload) == (created, '"x"')
    with transaction.atomic():
        queue.send("z", key="order-2", on_commit=True)
        transaction.set_rollback(True)
    assert queue.lookup("order-2") is None


def test_an_outbox_send_hands_its_key_to_the_outbox(queue: Queue) -> None:
    written: list[NewMessage] = []

    class Recording:
        def write(self, queue_name: str, messages: Any, *, using: str | None) -> None:
            written.extend(messages)

    plugged = features.outbox()
    features.plug_outbox(Recording())  # type: ignore[arg-type]
    try:
        returned = queue.send(
            "x", key="order-1", if_exists="replace", unique_for=2, outbox=True, delay=LATER
        )
    finally:
        features.plug_outbox(plugged)
    [message] = written
    assert message.id == returned
    assert (message.key, message.if_exists, message.unique_ms) == ("order-1", "replace", 2000)


# Cancel, reschedule and lookup, by key and by id.


def test_cancel_by_key_removes_only_a_waiting_message(queue: Queue) -> None:
    queue.send("x", key="order-1", delay=LATER)
    assert queue.cancel(key="order-1") is True
    assert queue.cancel(key="order-1") is False
    assert queue.lookup("order-1") is None
    assert queue.cancel(key="never-used") is False
    in_flight = queue.send("y", key="order-2")
    fetch_when_due(queue)
    assert queue.cancel(key="order-2") is False
    assert queue.peek(in_flight) is not None


def test_cancel_by_id_still_works_and_frees_the_key(queue: Queue) -> None:
    message_id = queue.send("x", key="order-1", delay=LATER)
    assert queue.cancel(message_id) is True
    assert queue.lookup("order-1") is None
    assert queue.send("y", key="order-1", delay=LATER) != message_id


def test_module_level_cancel_by_key_on_a_named_queue(queue: Queue) -> None:
    other = delayqueue.get_queue("other")
    other.send("x", key="order-1", delay=LATER)
    assert delayqueue.cancel(key="order-1") is False  # looks on "default" only
    assert delayqueue.cancel(key="order-1", queue="other") is True
    other.send("x", key="order-1", delay=LATER)
    assert asyncio.run(delayqueue.acancel(key="order-1", queue="other")) is True
    assert other.lookup("order-1") is None


@pytest.mark.parametrize("by", ["id", "key"])
def test_reschedule_moves_a_waiting_message(queue: Queue, by: str) -> None:
    message_id = queue.send("x", key="order-1", delay=LATER)

    def move(**timing: Any) -> bool:
        if by == "id":
            return queue.reschedule(message_id, **timing)
        return queue.reschedule(key="order-1", **timing)

    assert move(delay=3 * LATER) is True
    found = queue.peek(message_id)
    assert found is not None
    assert found.score_ms is not None
    assert found.score_ms >= store_time_ms(queue) + (3 * LATER - 1) * 1000
    at = timezone.now().replace(microsecond=0) + timedelta(hours=5)
    assert move(at=at) is True
    found = queue.peek(message_id)
    assert found is not None
    assert found.score_ms == int(at.timestamp()) * 1000
    assert move() is True  # neither: due now
    [delivery] = fetch_when_due(queue)
    assert delivery.id == message_id
    assert move(delay=LATER) is False  # in flight: left alone


def test_reschedule_of_nothing_waiting_is_false(queue: Queue) -> None:
    assert queue.reschedule(key="never-used", delay=1) is False
    assert queue.reschedule("unknown-id", delay=1) is False


def test_module_level_reschedule_and_its_async_twins(queue: Queue) -> None:
    message_id = queue.send("x", key="order-1", delay=LATER)
    assert delayqueue.reschedule(key="order-1", delay=2 * LATER) is True
    assert delayqueue.reschedule(key="order-1", queue="other") is False
    assert asyncio.run(delayqueue.areschedule(message_id, delay=LATER)) is True
    assert asyncio.run(queue.areschedule(key="order-1", delay=LATER)) is True
    found = asyncio.run(queue.alookup("order-1"))
    assert found is not None
    assert found.id == message_id


def test_lookup_follows_the_key_through_its_states(queue: Queue) -> None:
    assert queue.lookup("order-1") is None
    message_id = queue.send({"order": 1}, key="order-1", delay=LATER)
    pending = queue.lookup("order-1")
    assert pending is not None
    assert (pending.id, pending.state, pending.key, pending.payload) == (
        message_id,
        "pending",
        "order-1",
        '{"order":1}',
    )
    queue.reschedule(key="order-1")
    [delivery] = fetch_when_due(queue)
    in_flight = queue.lookup("order-1")
    assert in_flight is not None
    assert (in_flight.id, in_flight.state, in_flight.attempt) == (message_id, "unack", 1)
    queue.ack([delivery])
    assert queue.lookup("order-1") is None  # handled: the key names nothing
    # ...and the key index let go of it: Queue.ack tells the store the delivery had a key.
    assert queue.check_invariants().ok, queue.check_invariants().problems


def test_an_ack_of_plain_and_keyed_messages_drops_the_keys(queue: Queue) -> None:
    queue.send({"n": 1}, key="order-1")
    queue.send({"n": 2})
    deliveries = fetch_when_due(queue, 2)
    if len(deliveries) == 1:  # (a sharded queue hands out one shard's at a time)
        deliveries += fetch_when_due(queue, 1)
    assert sorted(d.key or "" for d in deliveries) == ["", "order-1"]
    assert len(queue.ack(iter(deliveries))) == 2  # (any iterable, read once)
    assert queue.check_invariants().ok, queue.check_invariants().problems


# The key wherever a message shows up: handlers, signals, the testing helpers.


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every worker signal sent during the test, with its arguments."""
    seen: list[tuple[str, dict[str, Any]]] = []
    connected: list[tuple[Signal, Any]] = []
    for name in ("message_acked", "message_nacked", "message_exhausted"):
        signal = getattr(signals, name)

        def receiver(*, name: str = name, **kwargs: Any) -> None:
            seen.append((name, kwargs))

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
    yield seen
    for signal, receiver in connected:
        signal.disconnect(receiver)


def test_handlers_and_the_ack_signal_see_the_key(
    queue: Queue, received: list[tuple[str, dict[str, Any]]]
) -> None:
    message_id = queue.send({"order": 1}, key="order-1")
    unkeyed = queue.send({"order": 2})
    seen: list[tuple[str | None, int]] = []

    def handler(message: Message) -> None:
        seen.append((message.key, message.generation))

    deliveries = fetch_when_due(queue, 2)
    if len(deliveries) == 1:  # (on a sharded queue, one fetch may find one shard's only)
        deliveries += fetch_when_due(queue)
    deliveries.sort(key=lambda delivery: delivery.id != message_id)
    outcomes = [call_handler(handler, delivery) for delivery in deliveries]
    assert [o.verdict for o in outcomes] == [Verdict.ACK, Verdict.ACK]
    assert seen[0][0] == "order-1"
    assert seen[0][1] > 0
    assert seen[1] == (None, 0)
    verdicts.commit(queue, Verdict.ACK, outcomes)
    acked = {kwargs["message"].id: kwargs["message"].key for name, kwargs in received}
    assert acked == {message_id: "order-1", unkeyed: None}


def test_the_exhausted_signal_carries_the_key(
    queue: Queue, received: list[tuple[str, dict[str, Any]]]
) -> None:
    message_id = queue.send("x", key="order-1", retry_count=0)
    [delivery] = fetch_when_due(queue)
    assert verdicts.commit(queue, Verdict.NACK, [Outcome(delivery, Verdict.NACK)]) is True
    verdicts.announce_exhaustions(queue)
    [exhausted] = [kwargs["message"] for name, kwargs in received if name == "message_exhausted"]
    assert (exhausted.id, exhausted.key) == (message_id, "order-1")


def test_a_superseded_message_is_not_announced_as_a_retry(
    queue: Queue, received: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    """A message refused while a newer one with its key waits is gone, not retried."""
    first = queue.send("old", key="digest", retry_count=3)
    [delivery] = fetch_when_due(queue)
    newer = queue.send("new", key="digest", delay=LATER)  # the key is free: a new message
    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        exhausted = verdicts.commit(
            queue, Verdict.NACK, [Outcome(delivery, Verdict.NACK, RuntimeError("boom"))]
        )
    assert exhausted is False
    [(name, kwargs)] = received
    assert name == "message_nacked"
    assert (kwargs["retry_at_ms"], kwargs["superseded"]) == (None, True)
    assert any("not retried: a newer message with its key" in r.message for r in caplog.records)
    assert queue.peek(first) is None
    found = queue.lookup("digest")
    assert found is not None
    assert found.id == newer


def test_a_plain_nack_signal_says_not_superseded(
    queue: Queue, received: list[tuple[str, dict[str, Any]]]
) -> None:
    queue.send("x", key="order-1", retry_count=1)
    [delivery] = fetch_when_due(queue)
    verdicts.commit(queue, Verdict.NACK, [Outcome(delivery, Verdict.NACK)])
    [(_name, kwargs)] = received
    assert kwargs["superseded"] is False
    assert kwargs["retry_at_ms"] is not None


def test_the_testing_helpers_show_the_key_of_what_was_sent(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": "tests.worker_handlers.handle"}
    }
    with memory_queues() as queues:
        first = delayqueue.send("x", key="order-1", delay=60)
        delayqueue.send("kept", key="order-1")
        delayqueue.send("y", key="order-1", if_exists="replace", delay=60)
        delayqueue.send("plain")
        sent = queues.sent()
    assert [(m.id == first, m.key, m.if_exists, m.payload) for m in sent] == [
        (True, "order-1", "keep", "x"),
        (True, "order-1", "replace", "y"),
        (False, None, None, "plain"),
    ]
