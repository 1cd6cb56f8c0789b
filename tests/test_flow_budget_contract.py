"""A sharded queue's budget for the whole queue (issue #27, engine.flow): the reserve,
settle and slot calls of shard 0, and the fetch modes of a shard, on every store alike
(each backend's shard 0: a queue of one shard's own store)."""

import time
from collections.abc import Callable

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.flow import GATES_RESERVED, GATES_SHARD, FlowState
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.sharding.store import parts
from tests.backends import REDIS_BACKENDS

pytestmark = pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)


def shard_0(queue: Queue) -> ShardStore:
    return parts(queue.store)["0"]


def test_a_reservation_takes_what_the_window_has_room_for(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(RATE_LIMIT="5/m"))
    first = store.reserve(3, "a")
    assert (first.granted, first.again_ms, first.rate) == (3, None, (5, 60_000))
    held = store.reserve(3, "b")
    assert held.granted == 2
    # Held back: when the oldest entry leaves the window, a period after it went in.
    assert held.again_ms == first.now_ms + 60_000
    assert store.reserve(3, "c").granted == 0


def test_a_repeated_reservation_takes_its_own_entries_again(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(RATE_LIMIT="5/m"))
    assert store.reserve(3, "a").granted == 3
    # The reply was lost, the fetch asks again under the same name: not 3 more.
    assert store.reserve(2, "a").granted == 2
    assert store.reserve(5, "b").granted == 2


def test_settling_gives_back_what_the_shards_did_not_hand_out(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(RATE_LIMIT="5/m"))
    assert store.reserve(4, "a").granted == 4
    store.settle("a", 4, 1, [])
    assert store.reserve(5, "b").granted == 4
    assert store.reserve(5, "c").granted == 0


def test_settling_keeps_what_a_lost_reply_may_have_handed_out(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(RATE_LIMIT="5/m", MAX_IN_FLIGHT=4))
    assert store.reserve(4, "a").granted == 4
    # One went out; two more were asked of a shard whose reply was lost: 3 stay used,
    # under the cap as x's slot and two of the reservation's.
    store.settle("a", 4, 3, ["x"])
    assert store.reserve(5, "b").granted == 1
    assert store.free_slots(["x"]) == 1
    assert store.reserve(5, "c").granted == 1  # the rate's window: 3 + 1 + 1 of 5


def test_settling_logs_what_went_out_beyond_the_reservation(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(RATE_LIMIT="5/m", MAX_IN_FLIGHT=9))
    # A repeat, reserving nothing, handed out again three its shard had recorded.
    store.settle("a", 0, 0, ["x", "y", "z"], 3)
    assert store.reserve(5, "b").granted == 2
    assert store.free_slots(["x", "y", "z"]) == 3


def test_the_rate_in_force_is_the_run_time_one(configure: Callable[..., Queue]) -> None:
    queue = configure(RATE_LIMIT="5/m")
    queue.set_rate_limit("2/h")
    store = shard_0(queue)
    reservation = store.reserve(5, "a")
    assert (reservation.granted, reservation.rate) == (2, (2, 3_600_000))
    queue.set_rate_limit(None)
    assert shard_0(configure()).reserve(5, "b").rate is None


def test_a_paused_queue_grants_nothing(configure: Callable[..., Queue]) -> None:
    queue = configure(RATE_LIMIT="5/m")
    queue.pause()
    reservation = shard_0(queue).reserve(5, "a")
    assert reservation.granted == 0
    assert reservation.again_ms is not None
    assert reservation.now_ms < reservation.again_ms <= reservation.now_ms + 1000


def test_slots_are_held_by_reservations_then_by_deliveries(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(MAX_IN_FLIGHT=3))
    first = store.reserve(5, "a")
    assert (first.granted, first.rate) == (3, None)
    held = store.reserve(1, "b")
    assert held.granted == 0
    assert held.again_ms is not None
    assert held.again_ms <= held.now_ms + 1000
    # Two of the three reserved went out: the third slot is free again.
    store.settle("a", 3, 2, ["x", "y"])
    assert store.reserve(5, "c").granted == 1
    assert store.free_slots(["x", "never-held"]) == 1
    assert store.reserve(5, "d").granted == 1
    assert store.extend_slots(["y", "never-held"]) == 1
    assert store.reserve(5, "e").granted == 0


def test_slots_free_themselves_when_their_leases_run_out(
    configure: Callable[..., Queue],
) -> None:
    store = shard_0(configure(MAX_IN_FLIGHT=3, MAX_CONSUME_DURATION=0.3))
    assert store.reserve(3, "a").granted == 3
    store.settle("a", 3, 3, ["x", "y", "z"])
    assert store.reserve(3, "b").granted == 0
    time.sleep(0.4)
    assert store.reserve(3, "c").granted == 3


def test_an_extended_slot_outlives_its_first_deadline(configure: Callable[..., Queue]) -> None:
    store = shard_0(configure(MAX_IN_FLIGHT=1, MAX_CONSUME_DURATION=0.4))
    store.settle("a", store.reserve(1, "a").granted, 1, ["x"])
    time.sleep(0.25)
    assert store.extend_slots(["x"]) == 1
    time.sleep(0.25)
    assert store.reserve(1, "b").granted == 0


def test_a_reserved_fetch_leaves_the_gates_to_the_reservation(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(RATE_LIMIT="2/h", MAX_IN_FLIGHT=2)
    queue.send_many([{"n": n} for n in range(5)])
    store = shard_0(queue)
    assert len(store.fetch(5, gates=GATES_RESERVED).deliveries) == 5
    queue.pause()
    queue.send_many([{"n": n} for n in range(2)])
    assert store.fetch(5, gates=GATES_RESERVED).deliveries == []


def test_a_shard_fetched_without_a_reservation_asks_for_one_under_a_run_time_rate(
    configure: Callable[..., Queue],
) -> None:
    queue = configure()
    queue.send_many([{"n": n} for n in range(3)])
    store = shard_0(queue)
    fetched = store.fetch(1, gates=GATES_SHARD)
    assert (len(fetched.deliveries), fetched.unreserved) == (1, False)
    # A shard that only notes the queue's rate (a copy of shard 0's) answers the same.
    store.copy_flow(FlowState(paused=False, rate=(5, 1000)))
    refused = store.fetch(5, gates=GATES_SHARD)
    assert (refused.deliveries, refused.unreserved) == ([], True)
    # Not a spin: the caller reserves and asks again at once.
    assert refused.next_ms == refused.now_ms
    assert store.flow().rate == (5, 1000)
    store.flow("rate", None)
    assert len(store.fetch(5, gates=GATES_SHARD).deliveries) == 2
