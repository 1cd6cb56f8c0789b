"""Damaged or foreign state never stops the queue: the bad message is moved aside,
logged, and the others flow. About Redis, whose keys anyone can write to: nothing but the
memory store itself can reach its structures."""

import logging
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES, NewMessage
from delayqueue_django.engine.memory import MemoryStore
from delayqueue_django.engine.memory.server import Meta
from delayqueue_django.engine.sharding.store import parts
from tests.helpers import fetch_when_due, redis_store, states_of


def test_pending_message_without_meta_is_moved_to_garbage(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # As a previous release stored it: the budget in the meta record, the payload bare. (A
    # message sent now carries its budget with its payload until it is first handed out.)
    queue = redis_queue
    key = queue.store.keys.key
    raw.zadd(key("pending"), {"broken": 0})
    raw.hset(key("payload"), "broken", '"broken"')
    healthy = queue.send("healthy")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        delivered = fetch_when_due(queue)
    assert [m.id for m in delivered] == [healthy]
    assert states_of(queue, "broken") == ["garbage"]
    assert "subject=broken" in caplog.text
    assert "meta record missing" in caplog.text


def test_pending_message_without_payload_is_moved_to_garbage(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = redis_queue
    broken, healthy = queue.send("broken"), queue.send("healthy")
    raw.hdel(queue.store.keys.key("payload"), broken)

    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        delivered = fetch_when_due(queue)
    assert [m.id for m in delivered] == [healthy]
    assert states_of(queue, broken) == ["garbage"]
    assert "payload missing" in caplog.text


def test_ready_message_without_payload_is_moved_to_garbage(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = redis_queue
    broken, healthy = queue.send("broken"), queue.send("healthy")
    queue.fetch(0)  # both staged in ready
    raw.hdel(queue.store.keys.key("payload"), broken)

    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        delivered = queue.fetch(10).messages
    assert [m.id for m in delivered] == [healthy]
    assert states_of(queue, broken) == ["garbage"]
    assert "payload missing" in caplog.text
    assert queue.stats()["unannounced"] == 0  # set aside, not exhausted


def test_unreadable_meta_is_moved_to_garbage(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    broken = queue.send("broken")
    raw.hset(queue.store.keys.key("meta"), broken, "not:a:number")
    assert queue.fetch(10).messages == []
    assert states_of(queue, broken) == ["garbage"]


def test_expired_delivery_without_meta_is_moved_to_garbage(redis_configure: Any, raw: Any) -> None:
    queue = redis_configure(MAX_CONSUME_DURATION=0.01)
    broken = queue.send("broken")
    fetch_when_due(queue)
    raw.hdel(queue.store.keys.key("meta"), broken)
    import time

    time.sleep(0.03)
    queue.fetch(0)
    assert states_of(queue, broken) == ["garbage"]


def test_payload_that_is_not_json_is_buried_and_logged(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    # Written past Queue.send's encoding, through the store itself: so on every store.
    queue.store.send([NewMessage(id="broken", payload="{not json", budget=3)])
    healthy = queue.send("healthy")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        delivered = fetch_when_due(queue)
    assert [m.id for m in delivered] == [healthy]
    assert states_of(queue, "broken") == ["garbage"]
    assert "undecodable payload, burying message id=broken" in caplog.text


@pytest.mark.parametrize("part", ["pending", "ready", "unack", "retry", "garbage", "exhausted"])
def test_a_key_of_the_wrong_type_is_renamed_aside_and_the_queue_carries_on(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture, part: str
) -> None:
    queue = redis_queue
    key = queue.store.keys.key(part)
    raw.set(key, "foreign value")

    stats = queue.stats()  # read-only: reports, counts the key as empty
    assert stats[part if part != "exhausted" else "unannounced"] == 0
    # Renamed aside by the first call that uses the key: a send, a fetch or a burial.
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        message_id, buried_id = queue.send("still works"), queue.send("buried")
        delivered = {m.id: m for m in fetch_when_due(queue, count=2)}
        assert queue.bury([delivered[buried_id]])
    assert "held a string instead of a" in caplog.text
    [renamed] = raw.zrange(queue.store.keys.key("quarantine"), 0, -1)
    assert renamed.startswith(queue.store.keys.key(f"quarantine:{part}:").encode())
    assert raw.get(renamed) == b"foreign value"
    assert queue.ack([delivered[message_id]]) == {message_id}
    assert states_of(queue, buried_id) == ["garbage"]


# Every step of the store with a set of messages in every state, on a queue whose key
# ``part`` holds a string: none may fail.
STEPS: dict[str, Callable[[Queue, dict[str, Any]], Any]] = {
    "send": lambda queue, held: queue.send("new"),
    "send_many": lambda queue, held: queue.store.send(
        [NewMessage(id=f"many-{n}", payload='"x"', budget=1) for n in range(3)]
    ),
    "fetch": lambda queue, held: queue.fetch(10, fetcher="f", request="r"),
    "ack": lambda queue, held: queue.ack([held["unack"]], fetcher="f", request="a"),
    "nack": lambda queue, held: queue.nack([held["unack"]], fetcher="f", request="n"),
    "bury": lambda queue, held: queue.bury([held["unack"]]),
    "release": lambda queue, held: queue.release([held["unack"]]),
    "extend": lambda queue, held: queue.extend([held["unack"]]),
    "cancel": lambda queue, held: queue.cancel(held["pending"]),
    "delete": lambda queue, held: queue.delete(held["garbage"]),
    "requeue": lambda queue, held: queue.requeue([held["garbage"]]),
    "deliver_now": lambda queue, held: queue.deliver_now([held["pending"]]),
    "purge_garbage": lambda queue, held: queue.purge_garbage(),
    "expire_garbage": lambda queue, held: queue.expire_garbage(),
    "claim": lambda queue, held: queue.store.claim_exhausted(10, 1000),
    "confirm": lambda queue, held: queue.store.confirm_exhausted([(held["garbage"], 1)]),
    "add_totals": lambda queue, held: queue.store.add_totals({"x": 1}),
    "prune_throughput": lambda queue, held: queue.store.prune_throughput(),
    "stats": lambda queue, held: queue.stats(),
    "list": lambda queue, held: [queue.list_messages(state) for state in STATES],
    "peek": lambda queue, held: queue.peek(held["pending"]),
    "check_invariants": lambda queue, held: queue.check_invariants(),
    "throughput": lambda queue, held: queue.throughput(2),
    "totals": lambda queue, held: queue.store.totals(),
}


def _messages_in_every_state(queue: Queue) -> dict[str, Any]:
    """One message buried (and unannounced), one in flight, one staged, one pending."""
    buried, in_flight = queue.send("buried"), queue.send("in flight")
    delivered = {m.id: m for m in fetch_when_due(queue, count=2)}
    queue.bury([delivered[buried]])
    staged = queue.send("staged")
    queue.fetch(0)
    pending = queue.send("pending", delay=3600)
    return {"garbage": buried, "unack": delivered[in_flight], "ready": staged, "pending": pending}


@pytest.mark.parametrize("part", [*STATES, "payload", "meta", "exhausted", "throughput"])
def test_no_step_fails_on_a_key_of_the_wrong_type(redis_queue: Queue, raw: Any, part: str) -> None:
    queue = redis_queue
    key = queue.store.keys.key(part)
    for name, step in STEPS.items():
        queue.store.client.flushall()  # type: ignore[attr-defined]
        held = _messages_in_every_state(queue)
        raw.delete(key)
        raw.set(key, "foreign value")
        step(queue, held)  # no WRONGTYPE, nor any other error
        # The key renamed aside or not (only a step that uses it meets it), the queue
        # carries on.
        message_id = queue.send("afterwards")
        assert message_id in {m.id for m in fetch_when_due(queue, count=10)}, name


def test_a_payload_hash_of_the_wrong_type_only_costs_the_payloads_it_held(
    redis_queue: Queue, raw: Any
) -> None:
    queue = redis_queue
    lost = queue.send("lost")
    raw.delete(queue.store.keys.key("payload"))
    raw.set(queue.store.keys.key("payload"), "foreign")
    fresh = queue.send("fresh")
    delivered = fetch_when_due(queue)
    assert [m.id for m in delivered] == [fresh]
    assert states_of(queue, lost) == ["garbage"]


def test_a_token_that_is_no_lease_never_matches_a_delivery_whose_meta_is_gone(
    redis_queue: Queue, raw: Any
) -> None:
    # Both read as nothing in the scripts; nothing must not match nothing. (Only a direct
    # store call can pass such a token: Queue passes the leases fetch handed out.)
    store = redis_queue.store
    [first, second] = [redis_queue.send(n) for n in ("one", "two")]
    fetch_when_due(redis_queue, count=2)
    raw.hdel(store.keys.key("meta"), first, second)
    assert store.ack([(first, "not a lease")]) == set()  # type: ignore[list-item]
    assert store.nack([(second, "not a lease", 0)]) == []  # type: ignore[list-item]
    assert store.release([(first, "x")]) == []  # type: ignore[list-item]
    assert store.extend([(first, "x")])[1] == []  # type: ignore[list-item]
    assert states_of(redis_queue, first) == states_of(redis_queue, second) == ["unack"]


def _orphan_meta(queue: Queue, message_id: str) -> None:
    """A meta record with no payload, as only damage leaves one (see send.lua)."""
    store = parts(queue.store)["0"]
    if isinstance(store, MemoryStore):
        state = store.server.state(store.keys.tag)
        state.metas[message_id] = Meta(lease=7, attempt=3, budget=5, due=0)
    else:
        redis_store(queue).client.hset(store.keys.key("meta"), message_id, "7:3:5:0")


@pytest.mark.parametrize("backend_url", ["standalone", "memory"], indirect=True)
def test_a_send_onto_an_orphaned_meta_record_is_a_new_message(queue: Queue) -> None:
    # Known means stored: a meta record without its payload is damage, not a message, so
    # every store takes the id as new (the memory store once refused it as a duplicate).
    # The send does not look for the damaged record (a plain send is one HSETNX), and the
    # first delivery reads it: the message takes over its lease, attempt and budget.
    _orphan_meta(queue, "orphan")
    queue.store.send([NewMessage("orphan", '"x"', 3)])
    [message] = fetch_when_due(queue)
    assert (message.id, message.payload, message.attempt) == ("orphan", "x", 4)
    assert queue.ack([message]) == {"orphan"}
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert report.messages == 0
