"""Review findings on sharded queues (regression tests)."""

import threading
import time
from typing import Any

from delayqueue_django.engine.sharded_store import ShardedStore
from tests.conftest import MEMORY_URL
from tests.redis_servers import RedisServer
from tests.test_shards import new_message, sharded, sharded_queue


def pump(subscription: Any) -> None:
    """Let the subscription tell the plan every wake-up published so far."""
    while subscription.wait(timeout=0.2) is not None:
        pass


def test_a_message_sent_while_the_subscription_was_lost_is_not_starved_by_busy_shards(
    redis_server: RedisServer, settings: Any
) -> None:
    """The listener lost its subscription and subscribed again (a new ShardedWakeups, as
    WakeupListener does). A message sent to shard 2.1 before the new subscription took
    effect went unheard; the plan still says 2.1 is empty. While shard 0 always has work
    due, a fetch asks only the due shards, and later sends to 2.1 publish nothing (its
    head is older): 2.1 would never be asked."""
    redis_server.client().flushall()
    queue = sharded_queue(settings, redis_server.url, 2)
    store = sharded(queue)
    assert isinstance(store, ShardedStore)
    first = store.subscribe_wakeups()
    assert store.fetch(10).deliveries == []  # every shard asked: all empty now
    first.close()  # the subscription is lost (the listener closes it and backs off)
    assert store.fetch(10).deliveries == []  # not listening: every shard asked, empty
    store.send([new_message("starved~2.1")])  # published to no one
    second = store.subscribe_wakeups()  # subscribed again
    try:
        fetched = []
        for n in range(20):
            store.send([new_message(f"busy{n}"), new_message(f"more{n}~2.1")])
            pump(second)
            result = store.fetch(1)
            fetched += [delivery.id for delivery in result.deliveries]
            store.ack([(d.id, d.lease) for d in result.deliveries])
        assert "starved~2.1" in fetched, fetched
    finally:
        second.close()


def test_a_slow_register_read_does_not_undo_a_newer_one(settings: Any, monkeypatch: Any) -> None:
    """Two threads read the register (the listener on LAYOUTS_CHANGED, the fetch loop when
    its recheck is due). The one that read first, before layout 4 was registered, must not
    follow its older reading after the other followed the newer one: layout 4's shards
    would be left out of the fetches (and the subscription) until the next recheck."""
    queue = sharded_queue(settings, MEMORY_URL, 2)
    store = sharded(queue)
    store.refresh_layouts(force=True)
    real = store.base.layouts
    slow = threading.Event()

    def layouts() -> set[int]:
        read = real()
        if threading.current_thread().name == "slow-reader":
            slow.set()
            time.sleep(0.3)  # read, not yet followed
        return read

    monkeypatch.setattr(store.base, "layouts", layouts)
    reader = threading.Thread(target=lambda: store.refresh_layouts(force=True), name="slow-reader")
    reader.start()
    assert slow.wait(5)
    store.base.add_layout(4)  # a sender of SHARDS 4 registers its layout
    store.refresh_layouts(force=True)
    assert "4.1" in store._order
    reader.join()
    assert "4.1" in store._order, store._order


def test_a_layout_retired_during_an_exhaustion_claim_does_not_fail_it(settings: Any) -> None:
    """claim_exhausted reads the shards' plans again after each shard's round trip; a
    layout retired meanwhile (by another thread's reading of the register) took its
    shards' plans away."""
    queue = sharded_queue(settings, MEMORY_URL, 1)
    store = sharded(queue)
    store.base.add_layout(2)
    store.refresh_layouts(force=True)
    assert store._order == ["0", "2.1"]
    draining = store._store("2.1")
    real = draining.claim_exhausted

    def claim_then_retire(count: int, claim_ms: int) -> list[Any]:
        claims = real(count, claim_ms)
        assert store.retire(2) == {}  # empty: retired, and the register read again
        return claims

    draining.claim_exhausted = claim_then_retire  # type: ignore[method-assign]

    assert store.claim_exhausted(10, 1000) == []
