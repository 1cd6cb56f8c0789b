"""Keyed messages (issue #26), the engine's contract: every store answers these alike,
through the Store API (``queue.store``). The semantics are the keys design's: at most one
waiting message per key, ``if_exists`` against it, ``unique_for`` holds, lookup, cancel and
reschedule by key, superseding on the way back to waiting, replays of lost replies.

Run on the memory store, on Redis (single, Cluster, Valkey, scripts) and on sharded queues
(in memory and over the Cluster), whose ids a keyed message gets on its key's shard."""

import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import BURY, DuplicateKey, KeyedSent, NewMessage, Store
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)

KEY = "order:42"
LATER_US = 60_000_000  # a minute: still pending when the test ends
HOLD_MS = 1000  # a hold a test outlives (it waits for the store's clock to pass it)

# Where a waiting message can be, and the state peek names for it.
WAITING = {"pending": "pending", "ready": "ready", "retry wait": "pending", "retry": "retry"}
NOT_WAITING = ["unack", "garbage", "handled"]
MODES = ["keep", "replace", "error"]


# How the test's queue places a new id with a key (a sharded queue: on the key's shard).
_placed: list[Callable[[str, str], str]] = [lambda message_id, key: message_id]


@pytest.fixture(autouse=True)
def _place_ids_by_key(queue: Queue) -> None:
    _placed[0] = lambda message_id, key: queue.store.place([message_id], [key])[0]


def store_of(queue: Queue) -> Store:
    return queue.store


def keyed(
    key: str = KEY,
    payload: str = '{"n":1}',
    *,
    if_exists: str = "keep",
    unique_ms: int = 0,
    delay_us: int = LATER_US,
    at_ms: int | None = None,
    budget: int = 2,
) -> NewMessage:
    return NewMessage(
        _placed[0](uuid.uuid4().hex, key),
        payload,
        budget,
        at_ms=at_ms,
        delay_us=delay_us,
        key=key,
        if_exists=if_exists,
        unique_ms=unique_ms,
    )


def send(store: Store, message: NewMessage) -> KeyedSent:
    [sent] = store.send_keyed([message])
    return sent


def fetch_one(store: Store, message_id: str) -> tuple[str, int]:
    """Hand out the message (due now): its id and lease."""
    [delivery] = store.fetch(1).deliveries
    assert delivery.id == message_id
    return delivery.id, delivery.lease


def put(store: Store, where: str, key: str = KEY, **options: int) -> str:
    """A message with ``key`` in the state ``where`` (a WAITING or NOT_WAITING name)."""
    message_id = send(store, keyed(key, delay_us=LATER_US if where == "pending" else 0)).id
    if where == "pending":
        return message_id
    if where == "ready":
        store.fetch(0)  # stages what is due, hands nothing out
        return message_id
    delivered, lease = fetch_one(store, message_id)
    if where == "retry wait":
        store.nack([(delivered, lease, 60_000)])
    elif where == "retry":
        store.nack([(delivered, lease, 0)])
        store.fetch(0)
    elif where == "garbage":
        store.nack([(delivered, lease, BURY)])
    elif where == "handled":
        store.ack([(delivered, lease)])
    return message_id


def counts(store: Store) -> list[int]:
    stats = store.stats()
    return [stats[state] for state in ("pending", "ready", "unack", "retry", "garbage")]


def peek_state(store: Store, message_id: str) -> str | None:
    stored = store.peek(message_id)
    return None if stored is None else stored.state


# Sending with a key


def test_a_new_key_creates_a_message_that_carries_it(queue: Queue) -> None:
    store = store_of(queue)
    before = store_time_ms(queue)
    message = keyed(payload='{"order":42}')
    sent = send(store, message)
    after = store_time_ms(queue)
    assert (sent.id, sent.outcome) == (message.id, "created")
    assert sent.due_ms is not None
    assert before + 60_000 <= sent.due_ms <= after + 60_001

    stored = store.peek(message.id)
    assert stored is not None
    assert (stored.state, stored.score_ms, stored.key) == ("pending", sent.due_ms, KEY)
    assert stored.payload == '{"order":42}'  # the key is not part of the payload
    assert stored.payload_size == len('{"order":42}')
    assert before <= stored.generation <= after
    assert store.peek_payload(message.id) == b'{"order":42}'
    [listed] = store.list("pending", offset=0, limit=10, preview_bytes=100)
    assert (listed.id, listed.key, listed.payload) == (message.id, KEY, '{"order":42}')
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state, found.key) == (message.id, "pending", KEY)


def test_a_delivery_carries_its_key_and_generation(queue: Queue) -> None:
    store = store_of(queue)
    message_id = send(store, keyed(payload='{"a":1}', delay_us=0)).id
    stored = store.peek(message_id)
    assert stored is not None
    [delivery] = store.fetch(1).deliveries
    assert (delivery.id, delivery.payload, delivery.key) == (message_id, '{"a":1}', KEY)
    assert delivery.generation == stored.generation > 0


def test_a_traced_keyed_payload_keeps_its_trace_context(queue: Queue) -> None:
    store = store_of(queue)
    traced = "^00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01^" + '{"t":1}'
    message_id = send(store, keyed(payload=traced, delay_us=0)).id
    stored = store.peek(message_id)
    assert stored is not None
    assert (stored.key, stored.payload) == (KEY, '{"t":1}')
    assert store.peek_payload(message_id) == b'{"t":1}'
    [delivery] = store.fetch(1).deliveries
    assert (delivery.key, delivery.payload) == (KEY, traced)


@pytest.mark.parametrize(
    "key", ["k", "order:42", "ü~^é 日本 \n\x00", "~5~7~x", "~", "k" * 256, "é" * 128]
)
def test_a_key_of_any_characters_up_to_its_bound_travels_intact(queue: Queue, key: str) -> None:
    store = store_of(queue)
    message_id = send(store, keyed(key, payload='"~x"', delay_us=0)).id
    found = store.lookup(key)
    assert found is not None
    assert (found.id, found.key, found.payload) == (message_id, key, '"~x"')
    [delivery] = store.fetch(1).deliveries
    assert (delivery.key, delivery.payload) == (key, '"~x"')
    assert store.lookup(key[:-1] or "other") is None


def test_a_listing_shows_the_key_whatever_its_preview(queue: Queue) -> None:
    store = store_of(queue)
    payload = '{"long":"' + "x" * 100 + '"}'
    message_id = send(store, keyed(payload=payload)).id
    for preview in (0, 5, 1000):
        [listed] = store.list("pending", offset=0, limit=10, preview_bytes=preview)
        assert (listed.id, listed.key) == (message_id, KEY)
        assert (listed.payload, listed.payload_size) == (payload[:preview], len(payload))


@pytest.mark.parametrize("where", WAITING)
def test_keep_leaves_the_waiting_message_as_it_is(queue: Queue, where: str) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    before, totals_before = store.peek(message_id), counts(store)
    assert before is not None

    sent = send(store, keyed(payload='{"n":2}', delay_us=5_000_000, budget=7))

    assert (sent.id, sent.outcome) == (message_id, "kept")
    if before.score_ms is not None:
        assert sent.due_ms == before.score_ms
    else:  # staged: when it became due
        assert sent.due_ms is not None
        assert sent.due_ms <= store_time_ms(queue)
    assert store.peek(message_id) == before
    assert counts(store) == totals_before
    found = store.lookup(KEY)
    assert found is not None
    assert found.id == message_id


@pytest.mark.parametrize("where", WAITING)
def test_replace_gives_the_waiting_message_the_new_payload_due_time_and_budget(
    queue: Queue, where: str
) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    before = store.peek(message_id)
    assert before is not None
    at_ms = store_time_ms(queue) + 30_000

    sent = send(store, keyed(payload='{"n":2}', at_ms=at_ms, budget=7, if_exists="replace"))

    assert (sent.id, sent.outcome, sent.due_ms) == (message_id, "replaced", at_ms)
    after = store.peek(message_id)
    assert after is not None
    assert (after.state, after.score_ms, after.payload) == ("pending", at_ms, '{"n":2}')
    assert (after.attempt, after.budget, after.key) == (0, 7, KEY)
    assert after.generation > before.generation
    assert counts(store)[:4] == [1, 0, 0, 0]


def test_a_replaced_message_is_delivered_as_a_first_attempt(queue: Queue) -> None:
    store = store_of(queue)
    message_id = put(store, "retry wait")
    send(store, keyed(payload='{"n":2}', delay_us=0, budget=5, if_exists="replace"))
    [delivery] = store.fetch(1).deliveries
    assert (delivery.id, delivery.payload, delivery.attempt) == (message_id, '{"n":2}', 1)
    assert delivery.budget == 5


def test_each_replace_gives_a_later_generation(queue: Queue) -> None:
    store = store_of(queue)
    message_id = send(store, keyed()).id
    generations = []
    for n in range(3):
        send(store, keyed(payload=f'{{"n":{n}}}', if_exists="replace"))
        stored = store.peek(message_id)
        assert stored is not None
        generations.append(stored.generation)
    assert generations == sorted(set(generations))


@pytest.mark.parametrize("where", WAITING)
def test_error_refuses_a_send_whose_key_has_a_waiting_message(queue: Queue, where: str) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    before, totals_before = store.peek(message_id), counts(store)

    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed(payload='{"n":2}', if_exists="error"))

    assert (refused.value.key, refused.value.message_id, refused.value.held) == (
        KEY,
        message_id,
        False,
    )
    assert KEY in str(refused.value)
    assert message_id in str(refused.value)
    assert store.peek(message_id) == before
    assert counts(store) == totals_before


@pytest.mark.parametrize("if_exists", MODES)
@pytest.mark.parametrize("where", NOT_WAITING)
def test_a_key_whose_message_is_in_flight_dead_or_handled_is_free(
    queue: Queue, where: str, if_exists: str
) -> None:
    store = store_of(queue)
    old_id = put(store, where)
    message = keyed(payload='{"n":2}', if_exists=if_exists)

    sent = send(store, message)

    assert (sent.id, sent.outcome) == (message.id, "created")
    assert peek_state(store, old_id) == (None if where == "handled" else where)
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state, found.payload) == (message.id, "pending", '{"n":2}')


# unique_for holds


def wait_past(queue: Queue, end_ms: int) -> None:
    wait_for(lambda: store_time_ms(queue) > end_ms, what="the store's clock to pass the hold")


def test_a_hold_stops_sends_with_its_key_until_it_ends(queue: Queue) -> None:
    store = store_of(queue)
    holder = send(store, keyed(unique_ms=HOLD_MS, delay_us=0)).id
    # Read after the send: the hold runs HOLD_MS from the send's clock, which this bounds
    # from above (read before it, a send slow under load outlived the wait below).
    sent_by = store_time_ms(queue)
    store.ack([fetch_one(store, holder)])  # handled: the key has no message left
    assert store.lookup(KEY) is None

    for if_exists in ("keep", "replace"):
        held = send(store, keyed(payload='{"n":2}', if_exists=if_exists))
        assert (held.id, held.outcome, held.due_ms) == (holder, "held", None)
    with pytest.raises(DuplicateKey) as refused:
        send(store, keyed(if_exists="error"))
    assert (refused.value.message_id, refused.value.held) == (holder, True)
    assert "unique_for" in str(refused.value)
    assert counts(store) == [0, 0, 0, 0, 0]

    wait_past(queue, sent_by + HOLD_MS + 1)
    message = keyed(if_exists="error")
    created = send(store, message)
    assert (created.id, created.outcome) == (message.id, "created")
    assert created.due_ms == send_due(store, message.id)


def send_due(store: Store, message_id: str) -> int | None:
    """The message's pending score."""
    stored = store.peek(message_id)
    return None if stored is None else stored.score_ms


def test_a_waiting_message_is_kept_or_replaced_while_its_hold_lasts(queue: Queue) -> None:
    store = store_of(queue)
    holder = send(store, keyed(unique_ms=60_000)).id
    assert send(store, keyed()).outcome == "kept"
    replaced = send(store, keyed(payload='{"n":2}', if_exists="replace"))
    assert (replaced.id, replaced.outcome) == (holder, "replaced")


def test_neither_cancel_nor_a_kept_or_held_send_changes_a_hold(queue: Queue) -> None:
    store = store_of(queue)
    holder = send(store, keyed(unique_ms=HOLD_MS)).id
    # Read after the send: the hold runs HOLD_MS from the send's clock, which this bounds
    # from above (read before it, a send slow under load outlived the wait below).
    sent_by = store_time_ms(queue)
    assert send(store, keyed(unique_ms=60_000)).outcome == "kept"  # does not extend it
    assert store.cancel_key(KEY) == holder
    held = send(store, keyed(unique_ms=60_000))  # does not extend it either
    assert (held.id, held.outcome, held.due_ms) == (holder, "held", None)

    wait_past(queue, sent_by + HOLD_MS + 1)
    message = keyed()
    assert send(store, message).outcome == "created"


def test_a_hold_is_per_key(queue: Queue) -> None:
    store = store_of(queue)
    send(store, keyed(unique_ms=60_000))
    assert store.cancel_key(KEY) is not None
    assert send(store, keyed("order:43")).outcome == "created"


# lookup, cancel and reschedule by key


def test_lookup_follows_the_keys_message_until_it_leaves_storage(queue: Queue) -> None:
    store = store_of(queue)
    assert store.lookup(KEY) is None
    message_id = send(store, keyed(delay_us=0)).id
    delivered, lease = fetch_one(store, message_id)
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state, found.attempt) == (message_id, "unack", 1)
    store.nack([(delivered, lease, BURY)])
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state) == (message_id, "garbage")
    assert store.drop_garbage(older_than_ms=None, limit=10, keep_unannounced=False) == (1, 0)
    assert store.lookup(KEY) is None


@pytest.mark.parametrize("where", WAITING)
def test_cancel_by_key_removes_the_waiting_message(queue: Queue, where: str) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    assert store.cancel_key(KEY) == message_id
    assert store.peek(message_id) is None
    assert store.lookup(KEY) is None
    assert counts(store) == [0, 0, 0, 0, 0]
    assert store.cancel_key(KEY) is None
    assert send(store, keyed()).outcome == "created"


@pytest.mark.parametrize("where", NOT_WAITING)
def test_cancel_by_key_leaves_a_message_in_flight_or_dead(queue: Queue, where: str) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    before = store.peek(message_id)
    assert store.cancel_key(KEY) is None
    assert store.peek(message_id) == before
    assert store.cancel_key("never used") is None


def reschedule(
    store: Store, by: str, message_id: str, *, at_ms: int | None = None, delay_us: int = 0
) -> int | None:
    """Reschedule the message by its id, or by KEY."""
    if by == "id":
        return store.reschedule(message_id=message_id, at_ms=at_ms, delay_us=delay_us)
    return store.reschedule(key=KEY, at_ms=at_ms, delay_us=delay_us)


@pytest.mark.parametrize("by", ["id", "key"])
@pytest.mark.parametrize("where", WAITING)
def test_reschedule_gives_a_waiting_message_a_new_due_time(
    queue: Queue, where: str, by: str
) -> None:
    store = store_of(queue)
    message_id = put(store, where)
    before = store.peek(message_id)
    assert before is not None
    at_ms = store_time_ms(queue) + 30_000

    assert reschedule(store, by, message_id, at_ms=at_ms) == at_ms

    after = store.peek(message_id)
    assert after is not None
    assert (after.state, after.score_ms, after.payload) == ("pending", at_ms, before.payload)
    assert (after.attempt, after.budget, after.lease) == (
        before.attempt,
        before.budget,
        before.lease,
    )
    assert after.generation == before.generation
    # Staged back in pending: a first attempt to ready, a retry to retry, when it falls due.
    assert reschedule(store, by, message_id) is not None
    assert store.fetch(0).deliveries == []
    assert peek_state(store, message_id) == ("ready" if before.attempt == 0 else "retry")


def test_reschedule_counts_a_delay_from_the_store_clock(queue: Queue) -> None:
    store = store_of(queue)
    message_id = send(store, keyed()).id
    before = store_time_ms(queue)
    due = store.reschedule(key=KEY, delay_us=90_500_000)
    after = store_time_ms(queue)
    assert due is not None
    assert before + 90_500 <= due <= after + 90_501
    assert send_due(store, message_id) == due
    assert send(store, keyed()) == KeyedSent(message_id, "kept", due)


def test_reschedule_of_a_plain_message_by_id(queue: Queue) -> None:
    store = store_of(queue)
    [message] = [NewMessage(uuid.uuid4().hex, '{"plain":1}', 2, delay_us=LATER_US)]
    store.send([message])
    at_ms = store_time_ms(queue) + 5_000
    assert store.reschedule(message_id=message.id, at_ms=at_ms) == at_ms
    stored = store.peek(message.id)
    assert stored is not None
    assert (stored.score_ms, stored.key) == (at_ms, None)


@pytest.mark.parametrize("by", ["id", "key"])
@pytest.mark.parametrize("where", ["unack", "garbage", "handled", "unknown"])
def test_reschedule_leaves_a_message_in_flight_dead_or_unknown(
    queue: Queue, where: str, by: str
) -> None:
    store = store_of(queue)
    message_id = "no-such-id" if where == "unknown" else put(store, where)
    before, totals_before = store.peek(message_id), counts(store)
    assert reschedule(store, by, message_id, at_ms=store_time_ms(queue) + 5_000) is None
    assert reschedule(store, by, message_id) is None
    assert store.peek(message_id) == before
    assert counts(store) == totals_before


def test_an_earlier_due_time_wakes_the_workers(queue: Queue) -> None:
    store = store_of(queue)
    subscription = store.subscribe_wakeups()
    try:
        first = send(store, keyed()).due_ms
        assert subscription.wait(2.0) == first
        earlier = store_time_ms(queue) + 20_000
        assert store.reschedule(key=KEY, at_ms=earlier) == earlier
        assert subscription.wait(2.0) == earlier
        replaced = send(store, keyed(if_exists="replace", at_ms=earlier - 10_000))
        assert subscription.wait(2.0) == replaced.due_ms == earlier - 10_000
        store.reschedule(key=KEY, at_ms=earlier + 10_000)  # later: nobody to wake
        send(store, keyed(if_exists="replace", at_ms=earlier + 20_000))
        assert subscription.wait(0.2) is None
    finally:
        subscription.close()


# Returning to waiting: superseded by a newer waiting message


def in_flight_with_a_newer_waiting(store: Store) -> tuple[str, int, str]:
    """A keyed message handed out, and a newer one with its key waiting: ``(id, lease,
    newer id)``."""
    message_id, lease = fetch_one(store, put(store, "ready"))
    newer = send(store, keyed(payload='{"newer":1}'))
    assert newer.outcome == "created"
    return message_id, lease, newer.id


def assert_superseded(store: Store, message_id: str, newer_id: str) -> None:
    assert store.peek(message_id) is None
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state) == (newer_id, "pending")
    assert counts(store) == [1, 0, 0, 0, 0]
    assert store.totals().get("superseded") == 1
    assert store.stats()["superseded_total"] == 1


def test_a_nacked_message_is_superseded_by_a_newer_waiting_one(queue: Queue) -> None:
    store = store_of(queue)
    message_id, lease, newer_id = in_flight_with_a_newer_waiting(store)
    [outcome] = store.nack([(message_id, lease, 0)])
    assert (outcome.id, outcome.exhausted, outcome.superseded) == (message_id, False, True)
    assert_superseded(store, message_id, newer_id)


def test_a_released_message_is_superseded_by_a_newer_waiting_one(queue: Queue) -> None:
    store = store_of(queue)
    message_id, lease, newer_id = in_flight_with_a_newer_waiting(store)
    assert store.release([(message_id, lease)]) == []
    assert_superseded(store, message_id, newer_id)


def test_a_timed_out_delivery_is_superseded_by_a_newer_waiting_one(
    configure: Callable[..., Queue],
) -> None:
    store = store_of(configure(MAX_CONSUME_DURATION=0.05))
    message_id, _, newer_id = in_flight_with_a_newer_waiting(store)
    assert wait_for(lambda: store.fetch(0).expired, what="the delivery to time out") == 1
    assert_superseded(store, message_id, newer_id)


def test_a_requeued_dead_letter_stays_dead_while_a_newer_one_waits(queue: Queue) -> None:
    store = store_of(queue)
    message_id, lease, newer_id = in_flight_with_a_newer_waiting(store)
    store.nack([(message_id, lease, BURY)])
    assert store.requeue([message_id], 3) == []
    assert peek_state(store, message_id) == "garbage"
    found = store.lookup(KEY)
    assert found is not None
    assert found.id == newer_id


def test_a_burial_is_not_superseded(queue: Queue) -> None:
    store = store_of(queue)
    message_id, lease, _ = in_flight_with_a_newer_waiting(store)
    [outcome] = store.nack([(message_id, lease, BURY)])
    assert (outcome.exhausted, outcome.superseded) == (True, False)
    assert peek_state(store, message_id) == "garbage"
    [claim] = store.claim_exhausted(10, 60_000)
    assert (claim.id, claim.key, claim.payload) == (message_id, KEY, '{"n":1}')


def test_a_message_back_to_waiting_takes_its_key_when_the_newer_is_in_flight(
    queue: Queue,
) -> None:
    store = store_of(queue)
    message_id, lease = fetch_one(store, put(store, "ready"))
    newer_id, newer_lease = fetch_one(store, send(store, keyed(delay_us=0)).id)

    [outcome] = store.nack([(message_id, lease, 60_000)])
    assert not outcome.superseded
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state) == (message_id, "pending")
    assert send(store, keyed()).id == message_id  # kept

    [newer_outcome] = store.nack([(newer_id, newer_lease, 0)])
    assert newer_outcome.superseded
    assert store.peek(newer_id) is None


def test_a_message_back_to_waiting_takes_its_key_after_the_newer_was_handled(
    queue: Queue,
) -> None:
    store = store_of(queue)
    message_id, lease = fetch_one(store, put(store, "ready"))
    newer_id = send(store, keyed(delay_us=0)).id
    store.ack([fetch_one(store, newer_id)])
    assert store.lookup(KEY) is None

    [outcome] = store.nack([(message_id, lease, 60_000)])
    assert not outcome.superseded
    found = store.lookup(KEY)
    assert found is not None
    assert found.id == message_id
    # At most one waiting message per key: the key names it again.
    assert send(store, keyed()) == KeyedSent(message_id, "kept", outcome.at_ms)
    with pytest.raises(DuplicateKey):
        send(store, keyed(if_exists="error"))


def test_a_requeued_dead_letter_takes_its_key_when_the_newer_is_in_flight(queue: Queue) -> None:
    store = store_of(queue)
    message_id, lease = fetch_one(store, put(store, "ready"))
    store.nack([(message_id, lease, BURY)])
    newer_id = send(store, keyed(delay_us=0)).id
    fetch_one(store, newer_id)
    assert store.requeue([message_id], 3) == [message_id]
    found = store.lookup(KEY)
    assert found is not None
    assert (found.id, found.state) == (message_id, "pending")


# The key's pointer, dropped with its message


def test_the_key_is_forgotten_when_its_message_is_acked_removed_or_dropped(queue: Queue) -> None:
    store = store_of(queue)
    put(store, "handled")
    assert store.lookup(KEY) is None

    removed = put(store, "pending")
    assert store.remove(removed) == "pending"
    assert store.lookup(KEY) is None

    dead = put(store, "garbage")
    assert store.remove(dead, include_in_flight_and_dead=True) == "garbage"
    assert store.lookup(KEY) is None

    put(store, "garbage")
    assert store.drop_garbage(older_than_ms=None, limit=10, keep_unannounced=False) == (1, 0)
    assert store.lookup(KEY) is None
    assert send(store, keyed()).outcome == "created"


def test_an_older_message_leaving_keeps_the_keys_newer_one(queue: Queue) -> None:
    store = store_of(queue)
    old_id = put(store, "garbage")
    in_flight_id, lease = fetch_one(store, put(store, "ready", "order:43"))
    newer_id = send(store, keyed()).id
    newer_43 = send(store, keyed("order:43")).id

    assert store.drop_garbage(older_than_ms=None, limit=10, keep_unannounced=False) == (1, 0)
    store.ack([(in_flight_id, lease)])
    for key, expected in ((KEY, newer_id), ("order:43", newer_43)):
        found = store.lookup(key)
        assert found is not None
        assert found.id == expected
    assert store.peek(old_id) is None


# Replays of sends whose reply was lost


def test_a_replayed_send_is_acknowledged_and_written_once(queue: Queue) -> None:
    store = store_of(queue)
    message = keyed(unique_ms=60_000)
    first = send(store, message)
    again = send(store, message)
    assert again == first == KeyedSent(message.id, "created", first.due_ms)
    assert counts(store) == [1, 0, 0, 0, 0]
    # Even as an error send: it is the same send, not a second one.
    assert send(store, replace(message, if_exists="error")) == first


def test_a_replay_after_the_message_was_handed_out_is_acknowledged(queue: Queue) -> None:
    store = store_of(queue)
    message = keyed(delay_us=0)
    send(store, message)
    fetch_one(store, message.id)
    assert send(store, message) == KeyedSent(message.id, "created", None)
    assert counts(store) == [0, 0, 1, 0, 0]


def test_a_replay_after_a_replace_keeps_the_replacement(queue: Queue) -> None:
    store = store_of(queue)
    message = keyed()
    send(store, message)
    replacement = keyed(payload='{"n":2}', if_exists="replace")
    send(store, replacement)
    assert send(store, message).outcome == "created"
    stored = store.peek(message.id)
    assert stored is not None
    assert stored.payload == '{"n":2}'


# Batches


def test_items_of_one_key_in_a_batch_see_the_earlier_ones(queue: Queue) -> None:
    store = store_of(queue)
    first, second = keyed(), keyed(payload='{"n":2}')
    assert store.send_keyed([first, second]) == [
        KeyedSent(first.id, "created", send_due(store, first.id)),
        KeyedSent(first.id, "kept", send_due(store, first.id)),
    ]
    other, replacing = keyed("order:43"), keyed("order:43", '{"n":3}', if_exists="replace")
    [created, replaced] = store.send_keyed([other, replacing])
    assert (created.outcome, replaced.outcome, replaced.id) == ("created", "replaced", other.id)
    stored = store.peek(other.id)
    assert stored is not None
    assert stored.payload == '{"n":3}'
    held_key = [keyed("order:44", unique_ms=60_000, delay_us=0), keyed("order:44")]
    [holder, _] = store.send_keyed(held_key)
    store.ack([fetch_one(store, holder.id)])
    assert send(store, keyed("order:44")).outcome == "held"


def test_an_error_refuses_its_whole_batch_with_nothing_written(queue: Queue) -> None:
    store = store_of(queue)
    waiting_id = send(store, keyed()).id
    batch = [
        keyed("order:43", unique_ms=60_000),
        keyed(if_exists="replace", payload='{"n":2}'),
        keyed(if_exists="error"),
    ]
    with pytest.raises(DuplicateKey) as refused:
        store.send_keyed(batch)
    assert (refused.value.key, refused.value.message_id) == (KEY, waiting_id)
    assert counts(store) == [1, 0, 0, 0, 0]
    stored = store.peek(waiting_id)
    assert stored is not None
    assert stored.payload == '{"n":1}'
    assert store.lookup("order:43") is None
    # Nor did its hold start.
    assert send(store, keyed("order:43")).outcome == "created"

    in_batch = [keyed("order:45"), keyed("order:45", if_exists="error")]
    with pytest.raises(DuplicateKey) as refused_in_batch:
        store.send_keyed(in_batch)
    assert refused_in_batch.value.message_id == in_batch[0].id
    assert store.lookup("order:45") is None


def test_a_send_larger_than_a_batch_is_decided_in_order(configure: Callable[..., Queue]) -> None:
    store = store_of(configure(SEND_BATCH_SIZE=2))
    messages = [keyed(f"k{n % 3}", f'{{"n":{n}}}', if_exists="replace") for n in range(7)]
    sent = store.send_keyed(messages)
    assert [s.outcome for s in sent] == ["created"] * 3 + ["replaced"] * 4
    assert [s.id for s in sent] == [messages[n % 3].id for n in range(7)]
    # Each key's message has the payload of the last item with its key.
    for key, last in (("k0", 6), ("k1", 4), ("k2", 5)):
        found = store.lookup(key)
        assert found is not None
        assert found.payload == f'{{"n":{last}}}'
