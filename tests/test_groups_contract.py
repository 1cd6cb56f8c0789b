"""Ordered groups (issue #27), the engine's contract: every store answers these alike,
through the Store API (``queue.store``). The messages of one group are handed out one at a
time, in due-time order (ties in send order); the next waits until the one before is acked or
dead-lettered; a failing message holds its group through its retries; other groups are never
held up; cancel and delete free only what they held.

Run on the memory store, on Redis (single, Cluster, Valkey, scripts) and on sharded queues
(in memory and over the Cluster), whose grouped messages live on their group's shard."""

import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import BURY, NewMessage, Store
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)

# How the test's queue places a new id with a group (a sharded queue: on the group's shard).
_placed: list[Callable[[str, str], str]] = [lambda message_id, group: message_id]


@pytest.fixture(autouse=True)
def _place_ids_by_group(queue: Queue) -> None:
    _placed[0] = lambda message_id, group: queue.store.place([message_id], [group])[0]


def grouped(group: str, n: int, *, at_ms: int | None = None, budget: int = 2) -> NewMessage:
    return NewMessage(
        _placed[0](uuid.uuid4().hex, group), f'{{"n":{n}}}', budget, at_ms=at_ms, group=group
    )


def fetch_ids(store: Store, count: int = 10) -> list[tuple[str, int]]:
    return [(d.id, d.lease) for d in store.fetch(count).deliveries]


def ids_of(handed: list[tuple[str, int]]) -> list[str]:
    return [message_id for message_id, _ in handed]


def test_one_at_a_time_in_send_order_and_other_groups_go_on(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    # Equal due times: send order decides (the ids are random, so their order says nothing).
    a = [grouped("a", n, at_ms=now) for n in range(5)]
    b = [grouped("b", n, at_ms=now) for n in range(3)]
    plain = NewMessage(uuid.uuid4().hex, "{}", 2, at_ms=now)
    store.send([*a, *b, plain])
    in_a, in_b = {m.id for m in a}, {m.id for m in b}
    first = fetch_ids(store)
    assert sorted(ids_of(first)) == sorted([a[0].id, b[0].id, plain.id])
    seen_a, seen_b, handed = [], [], first
    while handed:
        assert len(in_a.intersection(ids_of(handed))) <= 1
        assert len(in_b.intersection(ids_of(handed))) <= 1
        seen_a += [i for i in ids_of(handed) if i in in_a]
        seen_b += [i for i in ids_of(handed) if i in in_b]
        assert store.ack(handed) == set(ids_of(handed))
        handed = fetch_ids(store)
    assert seen_a == [m.id for m in a]
    assert seen_b == [m.id for m in b]
    assert store.stats()["pending"] == 0


def test_due_time_order_beats_send_order(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    later, sooner = grouped("g", 1, at_ms=now + 300), grouped("g", 2, at_ms=now - 1000)
    store.send([later])
    store.send([sooner])
    order: list[str] = []
    deadline = now + 5000
    while len(order) < 2 and store_time_ms(queue) < deadline:
        handed = fetch_ids(store)
        order += ids_of(handed)
        store.ack(handed)
    assert order == [sooner.id, later.id]


def test_a_failing_message_holds_its_group_until_it_succeeds(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(message_id, lease)] = fetch_ids(store)
    assert message_id == first.id
    store.nack([(first.id, lease, 0)])
    # Its retry is due at once: it runs again, and the second still waits.
    [(again, lease)] = fetch_ids(store)
    assert again == first.id
    assert fetch_ids(store) == []
    store.ack([(first.id, lease)])
    assert ids_of(fetch_ids(store)) == [second.id]


def test_a_retry_not_yet_due_still_holds_the_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    store.nack([(first.id, lease, 60_000)])
    assert fetch_ids(store) == []
    parked = store.peek(second.id)
    assert parked is not None
    assert parked.state == "pending"
    assert parked.group == "g"
    assert parked.score_ms is not None
    assert parked.score_ms <= store_time_ms(queue)
    assert store.stats()["pending"] == 2


def test_a_dead_letter_frees_its_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1, budget=0), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    [outcome] = store.nack([(first.id, lease, 0)])
    assert outcome.exhausted
    assert ids_of(fetch_ids(store)) == [second.id]
    dead = store.peek(first.id)
    assert dead is not None
    assert dead.state == "garbage"
    assert dead.group == "g"


def test_buried_at_once_frees_its_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    store.nack([(first.id, lease, BURY)])
    assert ids_of(fetch_ids(store)) == [second.id]


def test_cancel_of_a_parked_message_frees_nothing(queue: Queue) -> None:
    store = queue.store
    first, second, third = grouped("g", 1), grouped("g", 2), grouped("g", 3)
    store.send([first, second, third])
    [(_, lease)] = fetch_ids(store)
    assert fetch_ids(store) == []  # parks the second and third
    assert store.remove(second.id)
    assert fetch_ids(store) == []  # the first still holds the group
    store.ack([(first.id, lease)])
    assert ids_of(fetch_ids(store)) == [third.id]
    assert store.peek(second.id) is None


def test_cancel_of_the_holder_waiting_for_its_retry_frees_the_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    store.nack([(first.id, lease, 60_000)])
    assert fetch_ids(store) == []
    assert store.remove(first.id)
    assert ids_of(fetch_ids(store)) == [second.id]


def test_delete_of_the_holder_in_flight_frees_the_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    fetch_ids(store)
    assert fetch_ids(store) == []
    assert store.remove(first.id, include_in_flight_and_dead=True)
    assert ids_of(fetch_ids(store)) == [second.id]


def test_a_requeued_dead_letter_waits_for_its_group_again(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1, budget=0), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    store.nack([(first.id, lease, BURY)])
    [(_, second_lease)] = fetch_ids(store)
    assert store.requeue([first.id], 1) == [first.id]
    assert fetch_ids(store) == []  # the second holds the group now
    store.ack([(second.id, second_lease)])
    assert ids_of(fetch_ids(store)) == [first.id]


def test_promote_of_a_parked_message_still_waits_for_its_group(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    assert fetch_ids(store) == []
    store.promote([second.id])
    assert fetch_ids(store) == []
    store.ack([(first.id, lease)])
    assert ids_of(fetch_ids(store)) == [second.id]


def test_a_parked_message_rescheduled_later_takes_its_new_place_in_the_group(
    queue: Queue,
) -> None:
    # Parked, then rescheduled past a message due after its old time: once due again and
    # parked again, it goes after that one (its old place is gone, not kept beside the new).
    store = queue.store
    now = store_time_ms(queue)
    holder, moved = grouped("g", 1, at_ms=now - 2000), grouped("g", 2, at_ms=now - 1000)
    store.send([holder, moved])
    [(_, lease)] = fetch_ids(store)
    assert fetch_ids(store) == []  # moved is parked behind the holder
    between = grouped("g", 3, at_ms=now - 500)
    store.send([between])
    assert fetch_ids(store) == []  # parked too
    assert store.reschedule(message_id=moved.id, at_ms=now + 300) is not None
    wait_for(lambda: store_time_ms(queue) > now + 300)
    assert fetch_ids(store) == []  # due again, parked again
    store.ack([(holder.id, lease)])
    order: list[str] = []
    while handed := fetch_ids(store):
        order += ids_of(handed)
        store.ack(handed)
    assert order == [between.id, moved.id]


def test_stats_count_parked_messages_as_due_but_no_next_due_time_nor_lag(
    queue: Queue,
) -> None:
    # Parked (scored far beyond any due time), they once made next_due_ms a date in the
    # year 144,740, which the admin and delayqueue_stats could not show.
    store = queue.store
    now = store_time_ms(queue)
    store.send([grouped("g", n, at_ms=now - 1000) for n in range(3)])
    assert len(fetch_ids(store)) == 1
    assert fetch_ids(store) == []  # the other two parked behind the holder
    stats = store.stats()
    assert stats["pending"] == stats["due"] == 2
    assert stats["next_due_ms"] == -1
    assert stats["lag_ms"] == 0
    later = grouped("h", 9, at_ms=now + 60_000)
    store.send([later])
    assert store.stats()["next_due_ms"] == later.at_ms


def test_plain_messages_carry_no_group(queue: Queue) -> None:
    store = queue.store
    plain = NewMessage(uuid.uuid4().hex, "{}", 2)
    store.send([plain])
    stored = store.peek(plain.id)
    assert stored is not None
    assert stored.group is None


def test_a_timed_out_delivery_goes_to_retry_and_still_holds_its_group(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05)
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(message_id, _)] = fetch_ids(store)
    assert message_id == first.id
    # The fetch that finds the delivery timed out redelivers it, not the next of its group
    # (again each time a redelivery outlives its 50 ms before its ack, on a loaded machine).
    while True:
        handed = wait_for(lambda: fetch_ids(store), what="the redelivery")
        assert ids_of(handed) == [first.id]
        if store.ack(handed):
            break
    assert ids_of(fetch_ids(store)) == [second.id]


def test_a_dead_letter_dropped_by_a_timed_out_last_attempt_frees_its_group(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05)
    store = queue.store
    first, second = grouped("g", 1, budget=0), grouped("g", 2)
    store.send([first, second])
    assert ids_of(fetch_ids(store)) == [first.id]
    # Its one attempt timed out: buried by the fetch, which hands the group on at once.
    handed = wait_for(lambda: fetch_ids(store), what="the next of the group")
    assert ids_of(handed) == [second.id]
    dead = store.peek(first.id)
    assert dead is not None
    assert dead.state == "garbage"


# With expiry: a grouped message dead-lettered as expired passes its group on.


def test_an_expired_message_passes_its_group_on(queue: Queue) -> None:
    store = queue.store
    now = store_time_ms(queue)
    holder = grouped("g", 1, at_ms=now)
    expiring = replace(grouped("g", 2, at_ms=now), expires_in_us=300_000)
    store.send([holder, expiring])
    [(_, lease)] = fetch_ids(store)
    until = store_time_ms(queue) + 301
    wait_for(lambda: store_time_ms(queue) > until, what="the expiry to pass")
    store.ack([(holder.id, lease)])  # the group passes to the expiring one...
    assert fetch_ids(store) == []  # ...which expires as it is staged, and passes it on
    dead = store.peek(expiring.id)
    assert dead is not None
    assert (dead.state, dead.dead_reason) == ("garbage", "expired")
    later = grouped("g", 3)
    store.send([later])
    assert ids_of(fetch_ids(store)) == [later.id]


@pytest.mark.parametrize("staged", ["by that fetch", "by an earlier one"])
def test_a_fetch_that_dead_letters_an_expired_holder_says_its_group_has_work_now(
    queue: Queue, staged: str
) -> None:
    # Issue #33: the fetch read the pending head (the next one's parked score, the year
    # 142,000,000) before the expiry passed the group on, and answered it as next_ms: a
    # consumer sleeping until then stalled with the group's next message due. The holder
    # expires as the fetch stages it, or as it takes it from the staging list.
    store = queue.store
    now = store_time_ms(queue)
    expiring = replace(grouped("g", 1, at_ms=now), expires_in_us=300_000)
    following = grouped("g", 2, at_ms=now)
    if staged == "by that fetch":
        holder = grouped("g", 0, at_ms=now)
        store.send([holder, expiring, following])
        [(_, lease)] = fetch_ids(store)
        store.ack([(holder.id, lease)])  # the group passes to the expiring one
    else:
        store.send([expiring, following])
        store.fetch(0)  # stages the expiring one, the group's holder; parks the other
        assert store.stats()["ready"] == 1
    until = store_time_ms(queue) + 301
    wait_for(lambda: store_time_ms(queue) > until, what="the expiry to pass")
    fetched = store.fetch(10)
    assert fetched.deliveries == []
    assert fetched.next_ms == fetched.now_ms
    assert ids_of(fetch_ids(store)) == [following.id]


def test_a_message_postponed_too_often_passes_its_group_on(queue: Queue) -> None:
    store = queue.store
    first, second = grouped("g", 1), grouped("g", 2)
    store.send([first, second])
    [(_, lease)] = fetch_ids(store)
    [outcome] = store.nack([(first.id, lease, 0)], postponed=[first.id], max_postpones=0)
    assert outcome.exhausted
    dead = store.peek(first.id)
    assert dead is not None
    assert (dead.state, dead.dead_reason) == ("garbage", "postponed too often")
    assert ids_of(fetch_ids(store)) == [second.id]
