"""The outbox relay under partial outages: one queue's Redis down, or one master of a
sharded queue hung, holds back only its own rows; the others keep flowing."""

import functools
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import delayqueue_django as delayqueue
from delayqueue_django.engine.sharding.placement import shard_keys, shard_name, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.models import OutboxMessage
from delayqueue_django.outbox.relay import OutboxRelay
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers, RedisServer


@pytest.fixture
def sick_server(settings: Any, redis_server: RedisServer) -> Iterator[RedisServer]:
    """Queue "sick" on a Redis of its own (stopped by the tests), "healthy" on the suite's."""
    server = RedisServer()
    settings.DELAYQUEUES = {
        "healthy": {"URL": redis_server.url},
        "sick": {"URL": server.url, "OPTIONS": {"socket_timeout": 2, "retry": None}},
    }
    yield server
    server.close()


def waiting_ids(alias: str, queue: str) -> list[str]:
    rows = OutboxMessage.objects.using(alias).filter(queue=queue).order_by("id")
    return list(rows.values_list("message_id", flat=True))


def relay_thread(relay: OutboxRelay) -> threading.Thread:
    thread = threading.Thread(target=relay.run, name="test-relay", daemon=True)
    thread.start()
    return thread


def test_a_queue_whose_redis_is_down_holds_back_only_its_own_rows(
    database: str, sick_server: RedisServer
) -> None:
    """Before: the batch was one transaction over both queues, rolled back by the sick
    one: the healthy queue's rows waited with it."""
    healthy, sick = delayqueue.get_queue("healthy"), delayqueue.get_queue("sick")
    relay = OutboxRelay([healthy, sick], databases=[database])
    sick_server.stop()
    held = sick.send_many(["s1", "s2", "s3"], outbox=True, using=database)  # the oldest rows
    sent = healthy.send_many(["h1", "h2"], outbox=True, using=database)

    with pytest.raises(RedisConnectionError):
        relay.drain()  # a burst says what failed...

    # ...once the healthy queue's rows are in Redis; the sick one's wait, in order.
    assert sorted(m.id for m in healthy.list_messages("pending")) == sorted(sent)
    assert waiting_ids(database, "healthy") == []
    assert waiting_ids(database, "sick") == held

    sick_server.start()
    assert relay.drain() == 3
    assert sorted(m.id for m in sick.list_messages("pending")) == sorted(held)
    assert waiting_ids(database, "sick") == []


def test_a_running_relay_keeps_the_healthy_queue_flowing_and_logs_the_outage_once(
    database: str, sick_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: no row of the healthy queue reached Redis while the other's was down, and
    the failure was logged at every retry."""
    healthy, sick = delayqueue.get_queue("healthy"), delayqueue.get_queue("sick")
    relay = OutboxRelay([healthy, sick], databases=[database], poll_seconds=0.02)
    sick_server.stop()
    caplog.set_level(logging.WARNING, logger="delayqueue_django.relay")
    held = sick.send_many(list(range(5)), outbox=True, using=database)
    thread = relay_thread(relay)

    def relayed(ids: list[str]) -> bool:
        return {m.id for m in healthy.list_messages("pending", limit=100)} >= set(ids)

    try:
        # Rounds of rows written while the relay polls: each reaches Redis, however many
        # polls found the sick queue's rows waiting.
        for round_number in range(5):
            ids = healthy.send_many([round_number] * 3, outbox=True, using=database)
            wait_for(
                functools.partial(relayed, ids),
                timeout=10,
                what=f"round {round_number} of the healthy queue relayed",
            )
        assert waiting_ids(database, "sick") == held
        failures = [r for r in caplog.records if "'sick'" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in failures]
        assert "failed, its rows wait" in failures[0].getMessage()

        sick_server.start()
        wait_for(
            lambda: waiting_ids(database, "sick") == [], timeout=30, what="the sick rows relayed"
        )
        assert sorted(m.id for m in sick.list_messages("pending")) == sorted(held)
        assert any("'sick' answers again" in r.getMessage() for r in caplog.records)
    finally:
        relay.stop()
        thread.join(30)


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_hung_master_holds_back_only_its_shards_rows(
    settings: Any, cluster: RedisClusterServers
) -> None:
    """SHARDS 6 on 3 masters, one master paused (its socket hangs until the timeout; the
    package's defaults: 5 s, and redis-py's retries). Before: each batch held rows of every
    shard, waited out the timeout on the hung one, and rolled back: no shard's row reached
    Redis. Then, with the lanes sent one after the other: the first batch waited out
    redis-py's timeout and retries on the hung lane, over 20 s."""
    timeout = 5.0  # the package's socket timeout
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    settings.DELAYQUEUES = {"default": {"URL": cluster.url, "SHARDS": 6}}
    queue = delayqueue.get_queue()
    store = queue.store
    assert isinstance(store, ShardedStore)
    entry, base = cluster.nodes[0], cluster.master_for(store.keys.tag)
    hung = next(node for node in cluster.nodes if node not in (entry, base))
    hung_shards = {
        shard_name(6, index)
        for index in range(1, 6)
        if cluster.master_for(shard_keys(store.keys, 6, index).tag) is hung
    }
    assert hung_shards
    relay = OutboxRelay([queue], databases=["default"], poll_seconds=0.02)
    assert hung.process is not None
    thread = relay_thread(relay)

    def on_hung_master(message_id: str) -> bool:
        return shard_name(*shard_of(message_id)) in hung_shards

    held: list[str] = []

    def only_held_wait() -> bool:
        return set(waiting_ids("default", "default")) <= set(held)

    try:
        hung.process.send_signal(signal.SIGSTOP)
        for round_number in range(6):
            ids = queue.send_many([round_number] * 12, outbox=True, using="default")
            held += [message_id for message_id in ids if on_hung_master(message_id)]
            started = time.monotonic()
            wait_for(
                only_held_wait,
                timeout=4 * timeout,
                what=f"round {round_number}'s rows of the healthy shards relayed",
            )
            took = time.monotonic() - started
            # No round waits out the hung master's timeout: the first waits for it
            # LANE_PATIENCE_SECONDS at the most, the later ones not at all.
            assert took < timeout, f"round {round_number} took {took:.1f} s"
        assert held
        assert waiting_ids("default", "default") == held

        hung.process.send_signal(signal.SIGCONT)
        wait_for(
            lambda: waiting_ids("default", "default") == [],
            timeout=30,
            what="the hung master's rows relayed",
        )
        assert queue.stats()["pending"] == 6 * 12
    finally:
        relay.stop()
        thread.join(60)
