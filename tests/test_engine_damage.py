"""Damaged or foreign state never stops the queue: the bad message is moved aside,
logged, and the others flow. About Redis, whose keys anyone can write to: nothing but the
memory store itself can reach its structures."""

import logging
from typing import Any

import pytest

from delayqueue_django.engine import NewMessage
from delayqueue_django.queue import Queue
from tests.helpers import fetch_when_due, states_of


def test_pending_message_without_meta_is_moved_to_garbage(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = redis_queue
    broken, healthy = queue.send("broken"), queue.send("healthy")
    raw.hdel(queue.store.keys.key("meta"), broken)

    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        delivered = fetch_when_due(queue)
    assert [m.id for m in delivered] == [healthy]
    assert states_of(queue, broken) == ["garbage"]
    assert f"subject={broken}" in caplog.text
    assert "meta record missing" in caplog.text


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
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        message_id = queue.send("still works")
    assert "held a string instead of a" in caplog.text
    assert raw.get(queue.store.keys.key("quarantine")) == b"foreign value"
    [message] = fetch_when_due(queue)
    assert message.id == message_id
    assert queue.ack([message]) == {message_id}


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
