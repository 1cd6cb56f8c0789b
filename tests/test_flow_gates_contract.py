"""Flow gates (issue #27: pause, RATE_LIMIT, MAX_IN_FLIGHT), the engine's contract: every
store answers these alike, through the Queue and Store API. A sharded queue holds the
limits for the whole queue (one budget on shard 0, see engine.flow): the tests count over
all shards, and let a fetch take less than the whole allowance (it asks the shards due)."""

import time
from collections.abc import Callable

import pytest

from delayqueue_django.core.queue import Queue
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)


def send_due(queue: Queue, count: int) -> None:
    queue.send_many([{"n": n} for n in range(count)])


def fetch_all(queue: Queue, rounds: int = 3) -> list[str]:
    """What a few fetches in a row take (a sharded queue's fetch asks some shards each)."""
    taken = []
    for _ in range(rounds):
        taken += [message.id for message in queue.fetch(100).messages]
    return taken


def test_pause_holds_every_message_and_resume_hands_them_out(queue: Queue) -> None:
    send_due(queue, 5)
    queue.pause()
    assert queue.stats()["paused"] == 1
    assert queue.flow().paused
    fetched = queue.fetch(100)
    assert fetched.messages == []
    # Held back: the worker is told to look again later, never at once (no spin).
    assert fetched.next_ms is not None
    assert fetched.next_ms > fetched.now_ms
    # Sends keep arriving while paused; the due ones are staged, not handed out.
    send_due(queue, 2)
    assert fetch_all(queue) == []
    queue.resume()
    assert queue.stats()["paused"] == 0
    taken: set[str] = set()

    def all_taken() -> bool:
        taken.update(fetch_all(queue, 1))
        return len(taken) == 7

    wait_for(all_taken, timeout=2.0, what="every message handed out after resume")


def test_a_delivery_in_flight_finishes_while_paused(queue: Queue) -> None:
    send_due(queue, 1)
    (message,) = queue.fetch(1).messages
    queue.pause()
    assert queue.ack([message]) == {message.id}
    assert queue.stats()["unack"] == 0


def test_resume_wakes_idle_workers(queue: Queue) -> None:
    subscription = queue.store.subscribe_wakeups()
    try:
        queue.pause()
        queue.resume()
        assert subscription.wait(timeout=2.0) is not None
    finally:
        subscription.close()


def test_rate_limit_hands_out_no_more_than_the_limit_per_period(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(RATE_LIMIT="12/m")
    send_due(queue, 40)
    first = queue.fetch(100)
    taken = [m.id for m in first.messages] + fetch_all(queue, 8)
    assert 0 < len(taken) <= 12
    # Held back by the limit, the fetch says when a slot frees: later, not now.
    held = queue.fetch(100)
    assert len(taken) + len(held.messages) <= 12
    if not held.messages:
        assert held.next_ms is not None
        assert held.next_ms > held.now_ms


def test_held_back_messages_are_due_from_their_release(configure: Callable[..., Queue]) -> None:
    queue = configure(RATE_LIMIT="12/m")
    queue.send_many([{"n": n} for n in range(40)])
    time.sleep(0.3)
    fetched = queue.fetch(100)
    # The limit bound this fetch: lateness is counted from when it let them go.
    assert fetched.messages
    assert all(message.due_ms >= fetched.now_ms for message in fetched.messages)


def test_rate_limit_window_slides(configure: Callable[..., Queue]) -> None:
    queue = configure(RATE_LIMIT="12/s")
    send_due(queue, 60)
    start = time.monotonic()
    taken: list[str] = []
    while time.monotonic() - start < 2.5:
        taken += [m.id for m in queue.fetch(100).messages]
        time.sleep(0.05)
    # 2.5 s: at most 3 windows' worth (the third partly), and more than one window's.
    assert 12 < len(taken) <= 36


def test_set_rate_limit_overrides_the_setting_until_unset(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(RATE_LIMIT="1000/s")
    queue.set_rate_limit("12/h")
    flow = queue.flow()
    assert (flow.rate_limit, flow.rate_limit_overridden) == ("12/h", True)
    send_due(queue, 30)
    assert 0 < len(fetch_all(queue, 8)) <= 12
    queue.set_rate_limit(None)
    flow = queue.flow()
    assert (flow.rate_limit, flow.rate_limit_overridden) == ("1000/s", False)
    assert len(fetch_all(queue, 8)) > 0


def test_set_rate_limit_refuses_a_bad_rate(queue: Queue) -> None:
    for bad in ("ten", "10/d", "0/s", "-1/s"):
        with pytest.raises(ValueError, match="must be a rate like"):
            queue.set_rate_limit(bad)
    assert queue.flow().rate_limit == ""


def test_max_in_flight_caps_unacked_deliveries(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_IN_FLIGHT=6)
    send_due(queue, 30)
    held = []
    for _ in range(5):
        held += queue.fetch(100).messages
    assert 0 < len(held) <= 6
    assert queue.stats()["unack"] == len(held)
    queue.ack(held[:2])
    more = []
    for _ in range(5):
        more += queue.fetch(100).messages
    assert 0 < len(more) <= 2
    assert queue.stats()["unack"] <= 6


def test_a_fetch_the_cap_holds_back_says_so(configure: Callable[..., Queue]) -> None:
    # Issue #33: told, a consumer fetches again once an ack frees a slot (the worker does),
    # rather than at next_ms, the held-back look a second on.
    queue = configure(MAX_IN_FLIGHT=2)
    send_due(queue, 5)
    held = []
    for _ in range(5):
        held += queue.fetch(100).messages
    assert len(held) == 2
    fetched = queue.fetch(100)
    assert fetched.messages == []
    assert fetched.capped
    assert fetched.next_ms is not None
    assert fetched.next_ms > fetched.now_ms
    queue.ack(held[:1])
    [refill] = wait_for(lambda: queue.fetch(100).messages, timeout=1.0, what="the freed slot")
    queue.ack([held[1], refill])
    rest = []
    for _ in range(5):
        rest += queue.fetch(100).messages
    assert len(rest) == 2
    queue.ack(rest)
    # Nothing waits: nothing to say.
    assert not queue.fetch(100).capped


@pytest.mark.parametrize("options", [{"RATE_LIMIT": "2/m"}, {}])
def test_a_fetch_only_the_cap_holds_back_says_so(
    configure: Callable[..., Queue], options: dict[str, str]
) -> None:
    # A rate limit holding work back is no news an ack changes; nor a queue without gates.
    queue = configure(MAX_IN_FLIGHT=10, **options)
    send_due(queue, 5)
    fetched = [queue.fetch(100) for _ in range(5)]
    assert sum(len(f.messages) for f in fetched) == (2 if options else 5)
    assert not any(f.capped for f in fetched)


def test_a_lease_running_out_gives_its_slot_back(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_IN_FLIGHT=6, MAX_CONSUME_DURATION=0.3)
    send_due(queue, 12)
    first = []
    for _ in range(5):
        first += queue.fetch(100).messages
    assert 0 < len(first) <= 6
    time.sleep(0.4)
    # Nobody acked: the leases ran out, the slots are free again.
    again = wait_for(lambda: queue.fetch(100).messages, timeout=3.0)
    assert 0 < len(again) <= 6
