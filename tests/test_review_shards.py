"""Review findings on sharded queues (regression tests)."""

from typing import Any

from delayqueue_django.engine.sharded_store import ShardedStore
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
