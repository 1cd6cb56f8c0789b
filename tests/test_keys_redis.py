"""Keyed messages on Redis (send_keyed.lua, lookup.lua, reschedule.lua, remove.lua by key, and
the key index kept by ack, nack, release, fetch, requeue and drop_garbage), through the store,
on a single Redis (Functions and scripts), a 3-master Cluster and Valkey. The contract every
store shares is in test_keys_contract.py; these are the Redis specifics: the key index and
holds in Redis, superseding on every path back to waiting, replays, refused batches, and that
a queue that never used keys pays nothing for them."""

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import (
    Delivery,
    DuplicateKey,
    DuplicateMessageId,
    KeyedSent,
    NewMessage,
    RedisStore,
    StoredMessage,
)
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.engine.invariants import check_queue
from delayqueue_django.engine.records import BURY
from tests.helpers import redis_store, wait_for

MINUTE_US = 60_000_000


@pytest.fixture
def store(redis_queue: Queue) -> RedisStore:
    return redis_store(redis_queue)


def keyed(
    message_id: str,
    key: str = "k",
    payload: str = '"p"',
    *,
    if_exists: str = "keep",
    unique_ms: int = 0,
    delay_us: int = 0,
    at_ms: int | None = None,
    budget: int = 3,
) -> NewMessage:
    return NewMessage(
        message_id,
        payload,
        budget,
        at_ms=at_ms,
        delay_us=delay_us,
        key=key,
        if_exists=if_exists,
        unique_ms=unique_ms,
    )


def send(store: RedisStore, *messages: NewMessage) -> list[KeyedSent]:
    return store.send_keyed(messages)


def peek(store: RedisStore, message_id: str) -> StoredMessage:
    stored = store.peek(message_id)
    assert stored is not None, f"{message_id} is not stored"
    return stored


def fetch_one(store: RedisStore) -> Delivery:
    [delivery] = store.fetch(1).deliveries
    return delivery


def key_index(store: RedisStore) -> dict[str, str]:
    raw: Any = store.client.hgetall(store.keys.key("keys"))
    return {name.decode(): value.decode() for name, value in raw.items() if name}


def assert_sound(store: RedisStore) -> None:
    report = check_queue(store)
    assert report.ok, report.problems


# Putting message "a", key "k", in each state.


def in_pending(store: RedisStore) -> None:
    send(store, keyed("a", delay_us=MINUTE_US))


def in_ready(store: RedisStore) -> None:
    send(store, keyed("a"))
    store.fetch(0)  # the housekeeping stages it


def in_retry_wait(store: RedisStore) -> None:
    send(store, keyed("a"))
    delivery = fetch_one(store)
    store.nack([(delivery.id, delivery.lease, 60_000)])


def in_retry(store: RedisStore) -> None:
    send(store, keyed("a"))
    delivery = fetch_one(store)
    store.nack([(delivery.id, delivery.lease, 0)])
    store.fetch(0)


def in_flight(store: RedisStore) -> Delivery:
    send(store, keyed("a"))
    return fetch_one(store)


def dead(store: RedisStore) -> None:
    send(store, keyed("a"))
    delivery = fetch_one(store)
    store.nack([(delivery.id, delivery.lease, BURY)])


def handled(store: RedisStore) -> None:
    send(store, keyed("a"))
    delivery = fetch_one(store)
    store.ack([(delivery.id, delivery.lease)])


WAITING: dict[str, Callable[[RedisStore], object]] = {
    "pending": in_pending,
    "ready": in_ready,
    "retry wait": in_retry_wait,
    "retry": in_retry,
}
NOT_WAITING: dict[str, Callable[[RedisStore], object]] = {
    "in flight": in_flight,
    "dead": dead,
    "handled": handled,
}
STATE_OF = {"pending": "pending", "ready": "ready", "retry wait": "pending", "retry": "retry"}


@pytest.mark.parametrize("state", WAITING)
def test_keep_leaves_the_waiting_message_as_it_is(store: RedisStore, state: str) -> None:
    WAITING[state](store)
    before = peek(store, "a")
    [sent] = send(store, keyed("b", payload='"new"', delay_us=2 * MINUTE_US))
    assert (sent.id, sent.outcome) == ("a", "kept")
    assert peek(store, "a") == before
    assert before.state == STATE_OF[state]
    assert store.peek("b") is None
    assert_sound(store)


@pytest.mark.parametrize("state", WAITING)
def test_replace_gives_the_waiting_message_the_new_send(store: RedisStore, state: str) -> None:
    WAITING[state](store)
    before = peek(store, "a")
    [sent] = send(
        store, keyed("b", payload='"new"', if_exists="replace", delay_us=MINUTE_US, budget=7)
    )
    after = peek(store, "a")
    assert (sent.id, sent.outcome, sent.due_ms) == ("a", "replaced", after.score_ms)
    assert (after.state, after.payload, after.key) == ("pending", '"new"', "k")
    assert (after.attempt, after.budget) == (0, 7)
    assert after.generation > before.generation
    assert after.lease == before.lease  # a verdict of an older delivery never matches
    assert store.peek("b") is None
    assert_sound(store)


@pytest.mark.parametrize("state", WAITING)
def test_error_refuses_a_send_while_the_key_waits(store: RedisStore, state: str) -> None:
    WAITING[state](store)
    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed("b", if_exists="error"))
    assert (refused.value.key, refused.value.message_id, refused.value.held) == ("k", "a", False)
    assert "'k'" in str(refused.value)
    assert "'a'" in str(refused.value)
    assert store.peek("b") is None


@pytest.mark.parametrize("if_exists", ["keep", "replace", "error"])
@pytest.mark.parametrize("state", NOT_WAITING)
def test_a_key_whose_message_does_not_wait_is_free(
    store: RedisStore, state: str, if_exists: str
) -> None:
    NOT_WAITING[state](store)
    [sent] = send(store, keyed("b", payload='"new"', if_exists=if_exists))
    assert (sent.id, sent.outcome) == ("b", "created")
    assert sent.due_ms == peek(store, "b").score_ms
    assert key_index(store) == {"k": "b"}
    assert_sound(store)


def test_the_key_travels_with_each_delivery_and_listing(store: RedisStore) -> None:
    [sent] = send(store, keyed("a", key="ordre 42 ✓", payload='{"n": 1}'))
    [listed] = store.list("pending", offset=0, limit=10, preview_bytes=100)
    assert (listed.key, listed.payload, listed.payload_size) == ("ordre 42 ✓", '{"n": 1}', 8)
    delivery = fetch_one(store)
    assert (delivery.key, delivery.payload) == ("ordre 42 ✓", '{"n": 1}')
    assert delivery.generation == listed.generation > 0
    store.nack([(delivery.id, delivery.lease, BURY)])
    [claim] = store.claim_exhausted(10, 60_000)
    assert (claim.key, claim.payload) == ("ordre 42 ✓", '{"n": 1}')
    assert sent.id == "a"


def test_a_preview_cuts_the_payload_and_keeps_the_key_whole(store: RedisStore) -> None:
    send(store, keyed("a", key="k" * 256, payload='"' + "é" * 50 + '"'))
    [listed] = store.list("pending", offset=0, limit=10, preview_bytes=5)
    assert (listed.key, listed.payload, listed.payload_size) == ("k" * 256, '"éé', 102)
    shown = store.peek("a", preview_bytes=5)
    assert shown is not None
    assert (shown.key, shown.payload) == ("k" * 256, '"éé')
    assert store.peek_payload("a") == ('"' + "é" * 50 + '"').encode()


def test_a_traced_payload_keeps_its_trace_after_the_key(store: RedisStore) -> None:
    traced = "^00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01^[1]"
    send(store, keyed("a", payload=traced))
    assert peek(store, "a").payload == "[1]"
    assert fetch_one(store).payload == traced


# Holds (unique_for)


def test_a_hold_keeps_the_key_taken_after_its_message_is_handled(store: RedisStore) -> None:
    send(store, keyed("a", unique_ms=300))
    delivery = fetch_one(store)
    store.ack([(delivery.id, delivery.lease)])
    for if_exists in ("keep", "replace"):
        [sent] = send(store, keyed("b", if_exists=if_exists))
        assert (sent.id, sent.outcome, sent.due_ms) == ("a", "held", None)
    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed("b", if_exists="error"))
    assert (refused.value.message_id, refused.value.held) == ("a", True)
    assert "unique_for" in str(refused.value)
    assert store.peek("b") is None
    time.sleep(0.35)
    assert send(store, keyed("b"))[0] == KeyedSent("b", "created", peek(store, "b").score_ms)


def test_a_hold_is_a_string_that_redis_expires(store: RedisStore) -> None:
    send(store, keyed("a", key="order:42", unique_ms=60_000))
    client: Any = store.client
    hold = store.keys.key("hold:order:42")
    assert client.get(hold) == b"a"
    assert 59_000 < client.pttl(hold) <= 60_000


def test_a_kept_or_held_send_never_extends_a_hold(store: RedisStore) -> None:
    started = time.monotonic()
    send(store, keyed("a", unique_ms=400))
    time.sleep(0.2)
    assert send(store, keyed("b", unique_ms=400))[0].outcome == "kept"
    assert store.cancel_key("k") == "a"
    assert send(store, keyed("c", unique_ms=400))[0].outcome == "held"
    time.sleep(max(0.0, 0.45 - (time.monotonic() - started)))
    assert send(store, keyed("d"))[0].outcome == "created"


def test_a_waiting_message_counts_before_a_hold(store: RedisStore) -> None:
    send(store, keyed("a", unique_ms=60_000))
    assert send(store, keyed("b", if_exists="replace"))[0].outcome == "replaced"


# lookup, cancel_key, reschedule


def test_lookup_follows_the_keys_message_through_its_states(store: RedisStore) -> None:
    assert store.lookup("k") is None
    send(store, keyed("a"))
    found = store.lookup("k")
    assert found is not None
    assert (found.id, found.state, found.key) == ("a", "pending", "k")
    delivery = fetch_one(store)
    assert (found := store.lookup("k")) is not None
    assert found.state == "unack"
    store.nack([(delivery.id, delivery.lease, BURY)])
    assert (found := store.lookup("k")) is not None
    assert found.state == "garbage"
    send(store, keyed("b"))  # the dead letter does not wait: a new message
    assert (found := store.lookup("k")) is not None
    assert found.id == "b"
    delivery = fetch_one(store)
    store.ack([(delivery.id, delivery.lease)])
    # The latest message was handled; the older dead letter is not looked up.
    assert store.lookup("k") is None
    assert peek(store, "a").state == "garbage"


def test_cancel_key_removes_only_a_waiting_message(store: RedisStore) -> None:
    assert store.cancel_key("k") is None
    send(store, keyed("a"))
    assert store.cancel_key("k") == "a"
    assert store.peek("a") is None
    assert store.lookup("k") is None
    assert key_index(store) == {}
    send(store, keyed("b"))
    fetch_one(store)
    assert store.cancel_key("k") is None
    assert peek(store, "b").state == "unack"
    assert_sound(store)


@pytest.mark.parametrize("by", ["id", "key"])
@pytest.mark.parametrize("state", WAITING)
def test_reschedule_moves_a_waiting_message(store: RedisStore, state: str, by: str) -> None:
    WAITING[state](store)
    before = peek(store, "a")
    if by == "id":
        due = store.reschedule(message_id="a", delay_us=2 * MINUTE_US)
    else:
        due = store.reschedule(key="k", delay_us=2 * MINUTE_US)
    after = peek(store, "a")
    assert due is not None
    assert (after.state, after.score_ms) == ("pending", due)
    assert (after.attempt, after.budget, after.lease) == (
        before.attempt,
        before.budget,
        before.lease,
    )
    assert store.stats()["ready"] + store.stats()["retry"] == 0
    assert_sound(store)


@pytest.mark.parametrize("state", NOT_WAITING)
def test_reschedule_leaves_a_message_that_does_not_wait(store: RedisStore, state: str) -> None:
    NOT_WAITING[state](store)
    before = store.peek("a")
    assert store.reschedule(message_id="a", delay_us=MINUTE_US) is None
    assert store.reschedule(key="k", at_ms=1) is None
    assert store.peek("a") == before


def test_reschedule_of_an_unknown_id_or_key(store: RedisStore) -> None:
    assert store.reschedule(message_id="nobody", delay_us=0) is None
    assert store.reschedule(key="nothing", delay_us=0) is None
    send(store, keyed("a"))
    assert store.reschedule(key="other", delay_us=0) is None


def test_a_rescheduled_message_keeps_its_new_due_time_to_its_delivery(store: RedisStore) -> None:
    in_ready(store)  # the due time kept at the start of its payload
    # Far enough ahead that a slow machine has not passed it by the reschedule (a time
    # already past would be due now instead).
    soon = store.stats()["server_time_ms"] + 300
    assert store.reschedule(key="k", at_ms=soon) == soon
    delivery = wait_for(lambda: store.fetch(1).deliveries, what="the rescheduled message")[0]
    assert (delivery.id, delivery.due_ms) == ("a", soon)
    store.nack([(delivery.id, delivery.lease, 60_000)])  # now its meta record keeps it
    later = store.stats()["server_time_ms"] + 300
    assert store.reschedule(message_id="a", at_ms=later) == later
    delivery = wait_for(lambda: store.fetch(1).deliveries, what="the retry")[0]
    assert (delivery.due_ms, delivery.attempt) == (later, 2)


def test_reschedule_of_a_plain_message_by_id(store: RedisStore) -> None:
    [due] = store.send([NewMessage("plain", '"p"', 3, delay_us=MINUTE_US)])
    later = store.reschedule(message_id="plain", delay_us=2 * MINUTE_US)
    assert later is not None
    assert later > due
    assert peek(store, "plain").score_ms == later


# Returning to waiting: superseded when another message waits as the key's


def test_a_nack_supersedes_a_message_whose_key_has_a_newer_waiting_one(store: RedisStore) -> None:
    a = in_flight(store)
    assert send(store, keyed("b", payload='"newer"'))[0].outcome == "created"
    [outcome] = store.nack([(a.id, a.lease, 0)])
    assert (outcome.id, outcome.superseded, outcome.exhausted) == ("a", True, False)
    assert store.peek("a") is None
    assert key_index(store) == {"k": "b"}
    assert store.totals()["superseded"] == 1
    assert_sound(store)


def test_a_nack_retries_a_message_that_is_still_its_keys(store: RedisStore) -> None:
    a = in_flight(store)
    [outcome] = store.nack([(a.id, a.lease, 0)])
    assert not outcome.superseded
    assert (found := store.lookup("k")) is not None
    assert (found.id, found.state) == ("a", "pending")


def test_a_nack_takes_the_key_back_from_a_message_in_flight(store: RedisStore) -> None:
    a = in_flight(store)
    send(store, keyed("b"))
    b = fetch_one(store)
    assert not store.nack([(a.id, a.lease, 0)])[0].superseded
    assert key_index(store) == {"k": "a"}
    [outcome] = store.nack([(b.id, b.lease, 0)])
    assert outcome.superseded
    assert store.peek("b") is None
    assert_sound(store)


def test_in_one_nack_the_keys_own_message_wins(store: RedisStore) -> None:
    a = in_flight(store)
    send(store, keyed("b", payload='"newer"'))
    b = fetch_one(store)
    outcomes = store.nack([(a.id, a.lease, 0), (b.id, b.lease, 0)])
    assert [(o.id, o.superseded) for o in outcomes] == [("a", True), ("b", False)]
    assert key_index(store) == {"k": "b"}
    assert_sound(store)


def test_a_nack_that_buries_never_supersedes(store: RedisStore) -> None:
    a = in_flight(store)
    send(store, keyed("b"))
    [outcome] = store.nack([(a.id, a.lease, BURY)])
    assert outcome.exhausted
    assert not outcome.superseded
    assert peek(store, "a").state == "garbage"


def test_a_timed_out_delivery_is_superseded(redis_configure: Callable[..., Queue]) -> None:
    store = redis_store(redis_configure(MAX_CONSUME_DURATION=0.05))
    in_flight(store)
    send(store, keyed("b", delay_us=MINUTE_US))
    time.sleep(0.08)
    assert store.fetch(0).expired == 1
    assert store.peek("a") is None
    assert store.totals()["superseded"] == 1
    assert store.totals()["timed_out"] == 1
    assert key_index(store) == {"k": "b"}
    assert_sound(store)


def test_timed_out_deliveries_of_one_key_leave_one_waiting(
    redis_configure: Callable[..., Queue],
) -> None:
    store = redis_store(redis_configure(MAX_CONSUME_DURATION=0.05))
    in_flight(store)
    send(store, keyed("b"))
    fetch_one(store)
    time.sleep(0.08)
    assert store.fetch(0).expired == 2
    assert store.peek("a") is None
    assert peek(store, "b").state == "retry"
    assert key_index(store) == {"k": "b"}
    assert_sound(store)


def test_a_released_delivery_is_superseded(store: RedisStore) -> None:
    a = in_flight(store)
    send(store, keyed("b"))
    assert store.release([(a.id, a.lease)]) == []
    assert store.peek("a") is None
    assert key_index(store) == {"k": "b"}
    assert_sound(store)


def test_a_released_delivery_that_is_its_keys_goes_back(store: RedisStore) -> None:
    a = in_flight(store)
    assert store.release([(a.id, a.lease)]) == ["a"]
    assert peek(store, "a").state == "ready"


def test_a_requeue_leaves_a_superseded_dead_letter_dead(store: RedisStore) -> None:
    dead(store)
    send(store, keyed("b"))
    assert store.requeue(["a"], 3) == []
    assert peek(store, "a").state == "garbage"
    b = fetch_one(store)  # b in flight: a may take the key back
    assert store.requeue(["a"], 3) == ["a"]
    assert key_index(store) == {"k": "a"}
    assert store.nack([(b.id, b.lease, 0)])[0].superseded
    assert_sound(store)


def test_a_requeued_dead_letter_takes_its_key_back_from_an_empty_index(store: RedisStore) -> None:
    dead(store)
    send(store, keyed("b"))
    b = fetch_one(store)
    store.ack([(b.id, b.lease)])
    assert key_index(store) == {}  # the marker keeps the index, so the requeue keeps it too
    assert store.requeue(["a"], 3) == ["a"]
    assert key_index(store) == {"k": "a"}
    assert send(store, keyed("c"))[0].outcome == "kept"
    assert_sound(store)


# The key index forgets a message that leaves the queue


def test_an_ack_drops_the_key_only_when_it_names_the_message(store: RedisStore) -> None:
    a = in_flight(store)
    send(store, keyed("b"))
    store.ack([(a.id, a.lease)])
    assert key_index(store) == {"k": "b"}
    b = fetch_one(store)
    store.ack([(b.id, b.lease)])
    assert key_index(store) == {}
    assert store.client.exists(store.keys.key("keys")) == 1  # its marker stays
    assert_sound(store)


def test_a_cancel_or_delete_by_id_drops_the_key(store: RedisStore) -> None:
    send(store, keyed("a"))
    assert store.remove("a") == "pending"
    assert key_index(store) == {}
    in_flight(store)
    assert store.remove("a", include_in_flight_and_dead=True) == "unack"
    assert key_index(store) == {}


def test_a_purge_of_dead_letters_drops_their_keys(store: RedisStore) -> None:
    dead(store)
    assert key_index(store) == {"k": "a"}
    assert store.drop_garbage(older_than_ms=None, limit=100, keep_unannounced=False) == (1, 0)
    assert key_index(store) == {}
    assert store.lookup("k") is None


# Replays, batches, refusals


def test_a_replayed_send_writes_nothing(store: RedisStore) -> None:
    [first] = send(store, keyed("a", payload='"one"', delay_us=MINUTE_US))
    before = peek(store, "a")
    assert send(store, keyed("a", payload='"one"', delay_us=MINUTE_US)) == [first]
    send(store, keyed("b", payload='"two"', if_exists="replace"))
    replaced = peek(store, "a")
    [again] = send(store, keyed("a", payload='"one"', delay_us=MINUTE_US))
    assert (again.id, again.outcome, again.due_ms) == ("a", "created", replaced.score_ms)
    assert peek(store, "a") == replaced != before
    fetch_one(store)
    assert send(store, keyed("a", payload='"two"'))[0] == KeyedSent("a", "created", None)


def test_a_replayed_id_with_another_key_is_refused(store: RedisStore) -> None:
    send(store, keyed("a"))
    store.send([NewMessage("plain", '"p"', 3)])
    for message in (keyed("a", key="other"), keyed("plain")):
        with pytest.raises(DuplicateMessageId):
            send(store, message)


def test_two_items_of_one_key_in_a_batch(store: RedisStore) -> None:
    sent = send(store, keyed("a", payload='"1"'), keyed("b", payload='"2"'))
    assert [(s.id, s.outcome) for s in sent] == [("a", "created"), ("a", "kept")]
    sent = send(
        store,
        keyed("c", key="j", payload='"1"'),
        keyed("d", key="j", payload='"2"', if_exists="replace", delay_us=MINUTE_US),
    )
    assert [(s.id, s.outcome) for s in sent] == [("c", "created"), ("c", "replaced")]
    c = peek(store, "c")
    assert (c.payload, c.score_ms, c.generation > 0) == ('"2"', sent[1].due_ms, True)
    assert store.peek("b") is None
    assert store.peek("d") is None
    assert_sound(store)


def test_a_refusal_writes_nothing_of_its_batch(store: RedisStore) -> None:
    send(store, keyed("a", key="taken"))
    batch = [
        keyed("x", key="free", unique_ms=60_000),
        keyed("y", key="taken", if_exists="replace", payload='"lost"'),
        keyed("z", key="taken", if_exists="error"),
    ]
    with pytest.raises(DuplicateKey) as refused:
        send(store, *batch)
    assert (refused.value.key, refused.value.message_id) == ("taken", "a")
    assert store.peek("x") is None
    assert peek(store, "a").payload == '"p"'
    assert key_index(store) == {"taken": "a"}
    assert store.client.exists(store.keys.key("hold:free")) == 0


def test_a_refusal_names_a_key_made_of_any_characters(store: RedisStore) -> None:
    key = "line one\r\nline two ✓ \x00"
    send(store, keyed("a", key=key))
    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed("b", key="other"), keyed("c", key=key, if_exists="error"))
    assert (refused.value.key, refused.value.message_id) == (key, "a")
    assert (found := store.lookup(key)) is not None
    assert found.key == key


def test_an_error_item_meets_an_earlier_item_of_its_batch(store: RedisStore) -> None:
    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed("a"), keyed("b", if_exists="error"))
    assert refused.value.message_id == "a"
    assert store.peek("a") is None
    assert store.client.exists(store.keys.key("keys")) == 0


def test_a_batch_larger_than_a_script_call(redis_configure: Callable[..., Queue]) -> None:
    store = redis_store(redis_configure(SEND_BATCH_SIZE=2))
    batch = [keyed(f"m{n}", key=f"k{n % 3}") for n in range(7)]
    sent = send(store, *batch)
    assert [s.id for s in sent] == ["m0", "m1", "m2", "m0", "m1", "m2", "m0"]
    assert [s.outcome for s in sent] == ["created"] * 3 + ["kept"] * 4


def test_a_key_index_of_another_type_is_set_aside(store: RedisStore) -> None:
    client: Any = store.client
    client.set(store.keys.key("keys"), "foreign")
    a = in_flight(store)
    store.ack([(a.id, a.lease)])
    assert client.zcard(store.keys.key("quarantine")) == 1
    assert send(store, keyed("b"))[0].outcome == "created"
    assert key_index(store) == {"k": "b"}


# A queue that never used keys


def test_a_queue_that_never_used_keys_has_no_key_index(
    redis_configure: Callable[..., Queue],
) -> None:
    store = redis_store(redis_configure(MAX_CONSUME_DURATION=0.05))
    store.send([NewMessage(f"m{n}", '"p"', 3) for n in range(5)])
    first, second, third, fourth = store.fetch(4).deliveries
    store.ack([(first.id, first.lease)])
    store.nack([(second.id, second.lease, 0), (third.id, third.lease, BURY)])
    store.release([(fourth.id, fourth.lease)])
    store.fetch(1)
    time.sleep(0.08)
    store.fetch(0)  # a timeout
    store.requeue([third.id], 3)
    store.remove("m4")
    store.cancel_key("k")
    store.reschedule(key="k", delay_us=0)
    assert store.lookup("k") is None
    store.drop_garbage(older_than_ms=None, limit=10, keep_unannounced=False)
    assert store.client.exists(store.keys.key("keys")) == 0
    assert store.client.keys(store.keys.key("hold:*")) == []


# The invariant checker knows the key index


def test_the_checker_reports_two_waiting_messages_of_one_key(store: RedisStore) -> None:
    send(store, keyed("a"))
    client: Any = store.client
    client.hdel(store.keys.key("keys"), "k")
    send(store, keyed("b"))
    kinds = {(p.kind, p.subject) for p in check_queue(store).problems}
    assert ("key-waiting-twice", "k") in kinds
    assert ("key-not-indexed", "a") in kinds


def test_the_checker_reports_a_key_naming_a_message_not_stored(store: RedisStore) -> None:
    send(store, keyed("a"))
    client: Any = store.client
    client.hset(store.keys.key("keys"), "gone", "nobody")
    [problem] = check_queue(store).problems
    assert (problem.kind, problem.subject) == ("key-stale", "gone")


# Wake-ups


def wakeups(subscription: Any) -> list[int]:
    found = []
    while (due := subscription.wait(timeout=0.2)) is not None:
        found.append(due)
    return found


def test_a_replace_or_reschedule_due_earlier_wakes_idle_workers(store: RedisStore) -> None:
    send(store, keyed("a", delay_us=2 * MINUTE_US))
    subscription = store.subscribe_wakeups()
    try:
        send(store, keyed("b", if_exists="replace", delay_us=3 * MINUTE_US))
        assert wakeups(subscription) == []  # later: sleeping workers wake in time anyway
        [replaced] = send(store, keyed("c", if_exists="replace", delay_us=MINUTE_US))
        assert wakeups(subscription) == [replaced.due_ms]
        due = store.reschedule(key="k", delay_us=1000)
        assert wakeups(subscription) == [due]
        store.reschedule(key="k", delay_us=MINUTE_US)
        assert wakeups(subscription) == []
    finally:
        subscription.close()


# The async store


def test_the_async_store_sends_cancels_reschedules_and_looks_up_by_key(redis_queue: Queue) -> None:
    async def scenario() -> None:
        store = redis_queue.async_store()
        assert isinstance(store, AsyncRedisStore)
        [created] = await store.send_keyed([keyed("a", delay_us=MINUTE_US)])
        [kept] = await store.send_keyed([keyed("b")])
        assert (created.outcome, kept.outcome, kept.id) == ("created", "kept", "a")
        with pytest.raises(DuplicateKey):
            await store.send_keyed([keyed("b", if_exists="error")])
        due = await store.reschedule(key="k", delay_us=2 * MINUTE_US)
        assert due is not None
        assert due > (created.due_ms or 0)
        assert await store.reschedule(message_id="nobody") is None
        found = await store.lookup("k")
        assert found is not None
        assert (found.id, found.score_ms, found.key) == ("a", due, "k")
        assert await store.cancel_key("k") == "a"
        assert await store.cancel_key("k") is None
        assert await store.lookup("k") is None

    asyncio.run(scenario())
