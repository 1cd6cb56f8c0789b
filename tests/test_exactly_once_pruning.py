"""Pruning the processed records of EXACTLY_ONCE queues: past the records that must stay,
past a queue whose Redis fails, and never on the outbox relay's time."""

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.engine.sharding.placement import SHARD_MARK, key_shard
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.models import OutboxMessage
from delayqueue_django.outbox import exactly_once
from delayqueue_django.outbox.exactly_once import prune_queues
from delayqueue_django.outbox.models import ProcessedMessage
from delayqueue_django.worker import Worker
from tests.databases import database_params
from tests.helpers import wait_for
from tests.redis_servers import RedisServer

# The socket timeout of the queue whose Redis hangs: what a caller waiting for it loses.
HUNG_TIMEOUT = 6.0


@pytest.fixture(params=database_params())
def database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    alias: str = request.param
    # Each test starts with no pruning cursor.
    monkeypatch.setattr(exactly_once, "_prune_cursors", {})
    return alias


def old_ms() -> int:
    return time.time_ns() // 1_000_000 - 120_000


def message_ids(database: str) -> list[str]:
    records = ProcessedMessage.objects.using(database).order_by("message_id")
    return list(records.values_list("message_id", flat=True))


def test_pruning_goes_on_past_records_whose_messages_the_queue_still_holds(
    database: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: each round began at the oldest record and read PRUNE_BATCHES_PER_ROUND x
    PRUNE_BATCH at most: behind that many records of messages the queue still holds (dead
    letters kept for good), no record was pruned again, and the same ones were looked up in
    Redis round after round."""
    monkeypatch.setattr(exactly_once, "PRUNE_BATCH", 2)
    monkeypatch.setattr(exactly_once, "PRUNE_BATCHES_PER_ROUND", 2)
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {
        "default": {"URL": url, "EXACTLY_ONCE": database, "EXACTLY_ONCE_RETENTION": 60}
    }
    held = get_queue().send_many(["x"] * 5, delay=3600)
    old = old_ms()
    ProcessedMessage.objects.using(database).bulk_create(
        [ProcessedMessage(queue="default", message_id=i, processed_ms=old) for i in held]
        + [ProcessedMessage(queue="default", message_id="gone", processed_ms=old)]
    )
    assert prune_queues(["default"]) == 0  # the first four held
    assert prune_queues(["default"]) == 1  # the fifth, then "gone"
    assert message_ids(database) == sorted(held)
    # Back to the oldest: nothing more, and no record is left unread.
    assert prune_queues(["default"]) == 0
    assert get_queue().cancel(held[0])
    assert prune_queues(["default"]) + prune_queues(["default"]) == 1
    assert message_ids(database) == sorted(held[1:])


def test_a_round_that_fails_leaves_the_cursor_past_the_last_statement_it_completed(
    database: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a round took its queue's cursor on starting and put it back only on
    finishing: a round that failed midway (a shard's Redis, the database) lost it, and the
    next began at the oldest record again, reading again what the failed one had read."""
    monkeypatch.setattr(exactly_once, "PRUNE_BATCH", 2)
    monkeypatch.setattr(exactly_once, "PRUNE_BATCHES_PER_ROUND", 2)
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {
        "default": {
            "URL": url,
            "SHARDS": 2,
            "EXACTLY_ONCE": database,
            "EXACTLY_ONCE_RETENTION": 60,
        }
    }
    queue = get_queue()
    # Two messages the queue holds on shard 0 (their keys' shard), which stay; then the
    # records of two messages of shard 1, and of one of shard 0, both long gone.
    keys = [key for key in (f"k{n}" for n in range(20)) if key_shard(key, 2) == 0][:2]
    held = [queue.send("x", key=key, delay=3600) for key in keys]
    assert all(SHARD_MARK not in message_id for message_id in held)
    gone = ["b1~2.1", "b2~2.1", "c"]
    old = old_ms()
    ProcessedMessage.objects.using(database).bulk_create(
        ProcessedMessage(queue="default", message_id=message_id, processed_ms=old + position)
        for position, message_id in enumerate(held + gone)
    )
    # Shard 1's payload hash made a string: the round's second statement fails there.
    client = redis.Redis.from_url(url)
    assert isinstance(queue.store, ShardedStore)
    shard_payloads = queue.store.shard_for(gone[0]).keys.key("payload")
    client.set(shard_payloads, "not a hash")
    assert prune_queues(["default"]) == 0
    client.delete(shard_payloads)
    # The next round goes on at the statement that failed, and reaches the last record.
    assert prune_queues(["default"]) == 3
    assert message_ids(database) == sorted(held)


def test_a_queue_whose_redis_fails_leaves_the_others_pruned(database: str, settings: Any) -> None:
    """Regression: only QueueUnavailable was caught; a ResponseError (here WRONGTYPE; an
    ACL's NOPERM, a cluster's errors alike) ended the round, and the queues after it were
    not pruned."""
    url = settings.DELAYQUEUES["default"]["URL"]
    options = {"URL": url, "EXACTLY_ONCE": database, "EXACTLY_ONCE_RETENTION": 60}
    settings.DELAYQUEUES = {"broken": options, "default": options}
    broken = get_queue("broken")
    # Its payload hash made a string: every lookup in it fails.
    redis.Redis.from_url(url).set(broken.store.keys.key("payload"), "not a hash")
    ProcessedMessage.objects.using(database).bulk_create(
        ProcessedMessage(queue=name, message_id=f"{name}-old", processed_ms=old_ms())
        for name in ("broken", "default")
    )
    assert prune_queues(["broken", "default"]) == 1
    assert message_ids(database) == ["broken-old"]


@pytest.fixture
def hung_server() -> Iterator[RedisServer]:
    """A Redis of its own, stopped with SIGSTOP (accepting connections, answering nothing)
    until the test ends."""
    server = RedisServer()
    assert server.process is not None
    try:
        yield server
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.close()


@pytest.mark.parametrize("database", database_params(("postgresql",)), indirect=True)
def test_a_hung_redis_of_one_queue_never_holds_up_the_relay_of_the_others(
    database: str, settings: Any, redis_server: RedisServer, hung_server: RedisServer
) -> None:
    """Regression: the worker pruned on its relay's thread, and pruning asks each queue's
    Redis which messages it holds: a hung one held the relay of every queue for its socket
    timeout, each round."""
    settings.DELAYQUEUE_OUTBOX_DATABASES = [database]
    settings.DELAYQUEUES = {
        "healthy": {"URL": redis_server.url},
        "sick": {
            "URL": hung_server.url,
            "EXACTLY_ONCE": database,
            "EXACTLY_ONCE_RETENTION": 60,
            "OPTIONS": {"socket_timeout": HUNG_TIMEOUT, "retry": None},
        },
    }
    # A record old enough that pruning asks the hung Redis about its message.
    ProcessedMessage.objects.using(database).create(
        queue="sick", message_id="old", processed_ms=old_ms()
    )
    healthy = get_queue("healthy")
    assert hung_server.process is not None
    hung_server.process.send_signal(signal.SIGSTOP)

    def handle(message: Message) -> None:
        pass

    worker = Worker([(healthy, handle), (get_queue("sick"), handle)], relay_poll=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()  # its first pruning round starts at once, and hangs
    try:
        rows = OutboxMessage.objects.using(database)
        for round_number in range(4):
            started = time.monotonic()
            healthy.send(round_number, outbox=True, using=database)
            wait_for(
                lambda: not rows.exists(),
                timeout=2 * HUNG_TIMEOUT,
                what=f"row {round_number} relayed",
            )
            took = time.monotonic() - started
            assert took < HUNG_TIMEOUT / 2, f"row {round_number} waited {took:.1f} s"
    finally:
        hung_server.process.send_signal(signal.SIGCONT)
        worker.request_stop()
        thread.join(30)
