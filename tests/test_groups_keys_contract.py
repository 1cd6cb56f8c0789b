"""Ordered groups with keys (issues #26 and #27), the engine's contract: every store answers
these alike, through the Store API (``queue.store``). A keyed message joins its group as any
grouped send does; a replace takes the key's waiting message out of the group it had (passing
the group on if it held it) and into the send's group as its latest send, placed by its new
due time; a keyed message superseded while it held its group passes it on; cancel and
reschedule by key do for groups what they do by id; keep, error and holds are unchanged.

Run on the memory store and on Redis (single, Cluster, Valkey, scripts): a queue of several
shards refuses a key with a group (tests/test_groups_api.py)."""

import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import DuplicateKey, KeyedSent, NewMessage, Store
from tests.backends import REDIS_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)

KEY = "order:42"
LATER_US = 60_000_000  # a minute: still pending when the test ends


def plain(group: str, n: int, *, at_ms: int | None = None) -> NewMessage:
    return NewMessage(uuid.uuid4().hex, f'{{"n":{n}}}', 2, at_ms=at_ms, group=group)


def keyed(
    group: str | None,
    n: int,
    *,
    key: str = KEY,
    if_exists: str = "keep",
    at_ms: int | None = None,
    delay_us: int = 0,
) -> NewMessage:
    return NewMessage(
        uuid.uuid4().hex,
        f'{{"n":{n}}}',
        2,
        at_ms=at_ms,
        delay_us=delay_us,
        key=key,
        if_exists=if_exists,
        group=group,
    )


def send(store: Store, message: NewMessage) -> KeyedSent:
    [sent] = store.send_keyed([message])
    return sent


def fetch(store: Store, count: int = 10) -> list[tuple[str, int]]:
    return [(d.id, d.lease) for d in store.fetch(count).deliveries]


def ids_of(handed: list[tuple[str, int]]) -> list[str]:
    return [message_id for message_id, _ in handed]


def group_of(store: Store, message_id: str) -> str | None:
    stored = store.peek(message_id)
    assert stored is not None
    return stored.group


def drain(store: Store) -> list[str]:
    """Fetch one at a time and ack, until nothing is handed out: the ids in order."""
    order: list[str] = []
    while handed := fetch(store, 1):
        order += ids_of(handed)
        store.ack(handed)
    return order


def test_a_keyed_message_joins_its_group_in_send_order(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    first, last = plain("g", 1, at_ms=now), plain("g", 3, at_ms=now)
    store.send([first])
    middle = send(store, keyed("g", 2, at_ms=now)).id
    store.send([last])
    [delivery] = store.fetch(10).deliveries
    assert delivery.id == first.id
    store.ack([(delivery.id, delivery.lease)])
    assert drain(store) == [middle, last.id]


def test_a_replace_moves_a_parked_message_behind_those_sent_before_it(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder = plain("g", 1, at_ms=now)
    store.send([holder])
    parked = send(store, keyed("g", 2, at_ms=now)).id
    after = plain("g", 3, at_ms=now)
    store.send([after])
    [(_, lease)] = fetch(store)
    assert fetch(store) == []  # both wait for the group, the keyed one first
    replaced = send(store, keyed("g", 4, if_exists="replace"))
    assert (replaced.id, replaced.outcome) == (parked, "replaced")
    stored = store.peek(parked)
    assert stored is not None
    assert (stored.state, stored.group) == ("pending", "g")
    store.ack([(holder.id, lease)])
    # The replace is the group's latest send: the one sent after the original goes first.
    assert drain(store) == [after.id, parked]


def test_a_replace_places_the_message_by_its_new_due_time(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder, sooner = plain("g", 1, at_ms=now), plain("g", 2, at_ms=now + 60_000)
    store.send([holder, sooner])
    later = send(store, keyed("g", 3, at_ms=now + 120_000)).id
    [(_, lease)] = fetch(store)
    # Replaced to be due now: it goes before the one sent before it but due later.
    assert send(store, keyed("g", 4, if_exists="replace")).id == later
    assert fetch(store) == []  # the holder still holds the group
    store.ack([(holder.id, lease)])
    [delivery] = store.fetch(10).deliveries
    assert (delivery.id, delivery.payload) == (later, '{"n":4}')


def test_a_replace_into_another_group_passes_the_old_one_on(queue: Queue) -> None:
    store = queue.store
    holder = send(store, keyed("a", 1)).id
    behind = plain("a", 2)
    store.send([behind])
    [(_, lease)] = fetch(store)
    store.nack([(holder, lease, 60_000)])  # waiting for its retry: it holds group a
    assert fetch(store) == []
    assert send(store, keyed("b", 3, if_exists="replace")).id == holder
    assert group_of(store, holder) == "b"
    # Group a went on to its next message; group b was free.
    assert sorted(ids_of(fetch(store))) == sorted([holder, behind.id])


def test_a_parked_message_replaced_into_another_group_leaves_its_old_one(
    queue: Queue,
) -> None:
    store = queue.store
    holder = plain("a", 1)
    store.send([holder])
    parked = send(store, keyed("a", 2)).id
    [(_, lease)] = fetch(store)
    assert fetch(store) == []
    send(store, keyed("b", 3, if_exists="replace"))
    assert ids_of(fetch(store)) == [parked]  # group b was free; group a still held
    store.ack([(holder.id, lease)])
    after = plain("a", 4)
    store.send([after])
    assert ids_of(fetch(store)) == [after.id]  # nothing of the keyed one was left in a


def test_a_replace_without_a_group_takes_the_message_out_of_its_group(queue: Queue) -> None:
    store = queue.store
    holder = plain("g", 1)
    store.send([holder])
    parked = send(store, keyed("g", 2)).id
    fetch(store)
    assert fetch(store) == []
    send(store, keyed(None, 3, if_exists="replace"))
    assert group_of(store, parked) is None
    assert ids_of(fetch(store)) == [parked]


def test_a_replaced_holder_waiting_for_its_retry_passes_its_group_on(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder = send(store, keyed("g", 1, at_ms=now)).id
    behind = plain("g", 2, at_ms=now)
    store.send([behind])
    [(_, lease)] = fetch(store)
    store.nack([(holder, lease, 60_000)])
    # Replaced in its own group: it is the group's latest send now.
    send(store, keyed("g", 3, if_exists="replace"))
    assert group_of(store, holder) == "g"
    assert drain(store) == [behind.id, holder]


def test_keep_and_error_leave_the_waiting_message_in_its_group(queue: Queue) -> None:
    store = queue.store
    waiting = send(store, keyed("g", 1, delay_us=LATER_US)).id
    kept = send(store, keyed("other", 2))
    assert (kept.id, kept.outcome) == (waiting, "kept")
    with pytest.raises(DuplicateKey):
        send(store, keyed("other", 3, if_exists="error"))
    assert group_of(store, waiting) == "g"


def test_a_hold_stops_a_grouped_send(queue: Queue) -> None:
    store = queue.store
    first = send(store, replace(keyed("g", 1), unique_ms=60_000)).id
    [(_, lease)] = fetch(store)
    store.ack([(first, lease)])
    held = send(store, keyed("g", 2))
    assert (held.id, held.outcome) == (first, "held")
    assert fetch(store) == []


@pytest.mark.parametrize("verdict", ["nack", "release"])
def test_a_superseded_holder_passes_its_group_on(queue: Queue, verdict: str) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder = send(store, keyed("g", 1, at_ms=now)).id
    [(_, lease)] = fetch(store)
    # The key's message is in flight: a new one with the key waits in the group behind it.
    newer = send(store, keyed("g", 2, at_ms=now)).id
    behind = plain("g", 3, at_ms=now)
    store.send([behind])
    assert newer != holder
    assert fetch(store) == []
    if verdict == "nack":
        [outcome] = store.nack([(holder, lease, 0)])
        assert outcome.superseded
    else:
        assert store.release([(holder, lease)]) == []
    assert store.peek(holder) is None
    assert store.totals()["superseded"] == 1
    assert drain(store) == [newer, behind.id]


def test_a_superseded_timed_out_holder_passes_its_group_on(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05)
    store = queue.store
    holder = send(store, keyed("g", 1)).id
    assert ids_of(fetch(store)) == [holder]
    newer = send(store, keyed("g", 2)).id
    # The fetch that finds the delivery timed out supersedes it, and hands out the newer.
    handed = wait_for(lambda: fetch(store), what="the newer message of the group")
    assert ids_of(handed) == [newer]
    assert store.peek(holder) is None


def test_cancel_by_key_of_a_holder_passes_its_group_on(queue: Queue) -> None:
    store = queue.store
    holder = send(store, keyed("g", 1)).id
    behind = plain("g", 2)
    store.send([behind])
    [(_, lease)] = fetch(store)
    store.nack([(holder, lease, 60_000)])
    assert fetch(store) == []
    assert store.cancel_key(KEY) == holder
    assert ids_of(fetch(store)) == [behind.id]


def test_cancel_by_key_of_a_parked_message_frees_nothing(queue: Queue) -> None:
    store = queue.store
    holder = plain("g", 1)
    store.send([holder])
    parked = send(store, keyed("g", 2)).id
    [(_, lease)] = fetch(store)
    after = plain("g", 3)
    store.send([after])
    assert fetch(store) == []
    assert store.cancel_key(KEY) == parked
    assert fetch(store) == []
    store.ack([(holder.id, lease)])
    assert drain(store) == [after.id]


def test_reschedule_by_key_of_a_parked_message_still_waits_for_its_group(
    queue: Queue,
) -> None:
    store = queue.store
    holder = plain("g", 1)
    store.send([holder])
    parked = send(store, keyed("g", 2)).id
    [(_, lease)] = fetch(store)
    assert fetch(store) == []
    assert store.reschedule(key=KEY, delay_us=0) is not None
    assert fetch(store) == []
    store.ack([(holder.id, lease)])
    assert ids_of(fetch(store)) == [parked]


def test_reschedule_by_key_of_a_holder_keeps_its_group(queue: Queue) -> None:
    store = queue.store
    holder = send(store, keyed("g", 1)).id
    behind = plain("g", 2)
    store.send([behind])
    [(_, lease)] = fetch(store)
    store.nack([(holder, lease, 60_000)])
    assert store.reschedule(key=KEY, delay_us=0) is not None
    # Due now, still the holder: it runs before the one behind it.
    assert drain(store) == [holder, behind.id]


def test_a_relayed_keyed_message_joins_and_moves_groups(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder = plain("a", 1, at_ms=now)
    store.send([holder])
    first = keyed("a", 2, at_ms=now)
    assert store.relay([first], forget=[], keep_ms=60_000) != [None]
    [(_, lease)] = fetch(store)
    assert fetch(store) == []  # the relayed one waits for group a
    moved = keyed("b", 3, at_ms=now, if_exists="replace")
    [due] = store.relay([moved], forget=[], keep_ms=60_000)
    assert due is not None
    assert group_of(store, first.id) == "b"
    assert ids_of(fetch(store)) == [first.id]
    store.ack([(holder.id, lease)])
