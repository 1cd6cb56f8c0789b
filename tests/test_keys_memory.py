"""Keyed messages on the memory store, where only it can show them: holds that end on its
moved clock to the ms and leave nothing behind, generations within one ms, the key index
emptied as messages leave, and what it records of keyed sends. (The contract itself is
tests/test_keys_contract.py's, on every store.)"""

import uuid

import pytest

from delayqueue_django.engine import BURY, NewMessage, QueueKeys, StoreLimits
from delayqueue_django.engine.invariants import check_queue
from delayqueue_django.engine.memory import ManualClock, MemoryServer, MemoryStore
from delayqueue_django.engine.memory.server import QueueState

START_MS = 1_700_000_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=START_MS)


@pytest.fixture
def server(clock: ManualClock) -> MemoryServer:
    return MemoryServer("keys", clock)


@pytest.fixture
def store(server: MemoryServer) -> MemoryStore:
    return MemoryStore(server, QueueKeys("dq", "keys"), StoreLimits())


def state_of(store: MemoryStore) -> QueueState:
    return store.server.state(store.keys.tag)


def keyed(
    key: str = "k",
    payload: str = "{}",
    *,
    if_exists: str = "keep",
    unique_ms: int = 0,
    delay_us: int = 0,
) -> NewMessage:
    return NewMessage(
        uuid.uuid4().hex,
        payload,
        2,
        delay_us=delay_us,
        key=key,
        if_exists=if_exists,
        unique_ms=unique_ms,
    )


def test_a_hold_ends_at_its_send_time_plus_unique_ms_and_is_then_forgotten(
    store: MemoryStore, clock: ManualClock
) -> None:
    [holder] = store.send_keyed([keyed(unique_ms=1000)])
    assert store.cancel_key("k") == holder.id
    clock.advance(0.999)
    [held] = store.send_keyed([keyed()])
    assert (held.id, held.outcome) == (holder.id, "held")
    clock.advance(0.001)
    [created] = store.send_keyed([keyed()])
    assert created.outcome == "created"
    state = state_of(store)
    assert (state.holders, len(state.hold_ends)) == ({}, 0)


def test_ended_holds_are_reclaimed_by_the_next_keyed_send(
    store: MemoryStore, clock: ManualClock
) -> None:
    store.send_keyed([keyed(f"k{n}", unique_ms=1000 + n) for n in range(100)])
    assert len(state_of(store).holders) == 100
    clock.advance(1.05)
    store.send_keyed([keyed("other")])
    state = state_of(store)
    # Those that ended by now are gone (a hold lasts until its end, exclusive).
    assert sorted(state.holders) == [f"k{n}" for n in range(51, 100)]
    assert len(state.hold_ends) == 49


def test_a_replace_within_the_same_ms_still_gives_a_later_generation(
    store: MemoryStore, clock: ManualClock
) -> None:
    [created] = store.send_keyed([keyed()])
    generations = []
    for _ in range(2):
        store.send_keyed([keyed(if_exists="replace")])
        stored = store.peek(created.id)
        assert stored is not None
        generations.append(stored.generation)
    clock.advance(1)
    store.send_keyed([keyed(if_exists="replace")])
    stored = store.peek(created.id)
    assert stored is not None
    assert [*generations, stored.generation] == [START_MS + 1, START_MS + 2, START_MS + 1000]


def test_the_key_index_forgets_every_message_that_leaves(store: MemoryStore) -> None:
    def delivered(key: str) -> tuple[str, int]:
        store.send_keyed([keyed(key)])
        [delivery] = store.fetch(1).deliveries
        return delivery.id, delivery.lease

    store.ack([delivered("acked")])
    store.send_keyed([keyed("cancelled", delay_us=60_000_000)])
    store.cancel_key("cancelled")
    store.nack([(*delivered("dropped"), BURY)])
    store.drop_garbage(older_than_ms=None, limit=10, keep_unannounced=False)
    superseded = delivered("superseded")
    [newer] = store.send_keyed([keyed("superseded", delay_us=60_000_000)])
    assert store.nack([(*superseded, 0)])[0].superseded
    assert state_of(store).keys == {"superseded": newer.id}


def test_a_keyed_send_without_a_key_is_refused_with_nothing_written(store: MemoryStore) -> None:
    plain = NewMessage(uuid.uuid4().hex, "{}", 2)
    with pytest.raises(ValueError, match="a keyed send needs a key"):
        store.send_keyed([keyed(), plain])
    assert store.stats()["pending"] == 0


def test_created_and_replaced_sends_are_recorded_kept_and_held_ones_not(
    store: MemoryStore, server: MemoryServer
) -> None:
    server.sent = []
    first, kept, replacing = (
        keyed(unique_ms=60_000),
        keyed(),
        keyed(payload='"b"', if_exists="replace"),
    )
    store.send_keyed([first, kept, replacing])
    store.cancel_key("k")
    store.send_keyed([keyed()])  # held
    assert [(record.message.id, record.message.payload) for record in server.sent] == [
        (first.id, "{}"),
        (first.id, '"b"'),
    ]


def test_keyed_messages_keep_the_invariants_in_every_state(store: MemoryStore) -> None:
    for key, delay_ms in (("retry", 60_000), ("dead", BURY), ("in flight", None)):
        store.send_keyed([keyed(key)])
        [delivery] = store.fetch(1).deliveries
        if delay_ms is not None:
            store.nack([(delivery.id, delivery.lease, delay_ms)])
    store.send_keyed([keyed("ready")])
    store.fetch(0)
    store.send_keyed([keyed("pending", delay_us=60_000_000)])
    report = check_queue(store)
    assert report.ok, report.problems
    assert report.counts == {"pending": 2, "ready": 1, "unack": 1, "retry": 0, "garbage": 1}


def test_the_invariant_checker_sees_the_key_index(store: MemoryStore) -> None:
    [sent] = store.send_keyed([keyed(delay_us=60_000_000)])
    state = state_of(store)
    # A second waiting message with the key, and a key naming a message that is gone, as
    # only a broken store would leave them.
    state.pending.add("intruder", START_MS)
    state.payloads["intruder"] = state.payloads[sent.id]
    state.metas["intruder"] = state.metas[sent.id]
    state.keys["gone"] = "no-such-id"
    problems = {(problem.kind, problem.subject) for problem in check_queue(store).problems}
    assert problems == {
        ("key-not-indexed", "intruder"),
        ("key-waiting-twice", "k"),
        ("key-stale", "gone"),
    }
