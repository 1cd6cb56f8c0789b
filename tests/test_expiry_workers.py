"""Expiry and Postpone with real worker processes (``manage.py run_delayqueue``) on Redis:
expired messages are dead-lettered and announced with ``message_expired``, also when the
announcing worker is killed (-9) before confirming and on a sharded queue over a Cluster; a
postpone uses no attempt (on one server and sharded over a Cluster), and endless postpones
end as a dead letter with their own reason."""

import signal
import time
from typing import Any

import pytest

from delayqueue_django.engine import EXPIRED, POSTPONED_TOO_OFTEN
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.test_worker_processes import WorkerProcess, events, queue_for, spawn, workers  # noqa: F401

pytestmark = pytest.mark.timeout(90)
HANDLER = {"DQ_TEST_HANDLER": "tests.expiry_handlers.handle"}
MESSAGES = 20


def expire_among_workers(
    workers: list[WorkerProcess],  # noqa: F811
    url: str,
    settings: Any,
    messages: int,
    *,
    kill_one: bool,
    shards: int = 1,
) -> None:
    """``messages`` that expire before any worker runs, beside as many that do not, with
    three worker processes (one killed with -9 mid-run when ``kill_one``): every expired one
    is announced with message_expired, none of them ever runs, and every other one is
    handled. The shared scenario of this module and tests/chaos/test_expiry_chaos.py."""
    queue = queue_for(settings, url, MAX_CONSUME_DURATION=1, SHARDS=shards)
    expiring = queue.send_many([{"n": n} for n in range(messages)], expires=0.2)
    lasting = queue.send_many([{"n": n} for n in range(messages)], expires=600)
    time.sleep(0.3)  # the first ones expire before any worker runs
    env = {"DQ_TEST_MAX_CONSUME": "1", "DQ_TEST_SHARDS": str(shards), **HANDLER}
    started = [spawn(workers, url, "--batch-size", "5", **env) for _ in range(3)]
    if kill_one:
        wait_for(lambda: events("done"), timeout=30, what="the first message handled")
        started[0].signal(signal.SIGKILL)
        started[0].wait(timeout=10)
    timeout = 30 + messages / 100
    wait_for(
        lambda: {entry["id"] for entry in events("expired")} == set(expiring),
        timeout=timeout,
        what="every expiry announced",
    )
    wait_for(
        lambda: {entry["id"] for entry in events("done")} == set(lasting),
        timeout=timeout,
        what="the others handled",
    )
    assert {entry["reason"] for entry in events("expired")} == {EXPIRED}
    assert {entry["id"] for entry in events("start")} == set(lasting)  # none expired ran
    assert events("dead") == []  # announced as expired, not as exhausted
    # (A killed worker's deliveries are acked by another once their lease ran out.)
    wait_for(
        lambda: queue.stats()["acked_total"] == messages and queue.stats()["unannounced"] == 0,
        timeout=30,
        what="the acks and the confirmations",
    )
    stats = queue.stats()
    assert (stats["expired_total"], stats["garbage"], stats["pending"]) == (messages, messages, 0)


def test_expired_messages_are_dead_lettered_with_their_signal_and_never_run(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    expire_among_workers(workers, redis_server.url, settings, MESSAGES, kill_one=False)


def test_expiry_holds_on_a_sharded_queue_over_a_cluster(
    workers: list[WorkerProcess],  # noqa: F811
    redis_cluster: RedisClusterServers,
    settings: Any,
) -> None:
    redis_cluster.flush()  # (the session's Cluster: other tests may have left messages)
    expire_among_workers(workers, redis_cluster.url, settings, MESSAGES, kill_one=False, shards=6)


def test_a_worker_killed_mid_run_loses_no_expiry_nor_message(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    expire_among_workers(workers, redis_server.url, settings, MESSAGES * 5, kill_one=True)


def test_the_expiry_signal_survives_a_kill_9_before_its_confirmation(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=1)
    message_id = queue.send({"n": 1}, expires=0.2)
    time.sleep(0.3)
    dying = spawn(
        workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", DQ_TEST_DIE_ON_EXPIRED="1", **HANDLER
    )
    assert dying.wait(timeout=20) == 9  # died inside the receiver, before confirming
    [first] = events("expired")
    assert (first["id"], first["pid"]) == (message_id, dying.pid)
    assert queue.stats()["unannounced"] == 1

    survivor = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", **HANDLER)
    wait_for(lambda: len(events("expired")) == 2, timeout=30, what="the second announcement")
    second = events("expired")[1]
    assert (second["id"], second["pid"], second["payload"]) == (message_id, survivor.pid, {"n": 1})
    wait_for(lambda: queue.stats()["unannounced"] == 0, what="the confirmation")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0


@pytest.mark.parametrize("sharded", [False, True], ids=["one server", "sharded on a cluster"])
def test_a_postponed_message_uses_no_attempt(
    workers: list[WorkerProcess],  # noqa: F811
    request: pytest.FixtureRequest,
    sharded: bool,
    settings: Any,
) -> None:
    """With no retry at all (RETRY_COUNT 0), a message postponed again and again still runs
    in the end, on its first attempt; on one server, and on a queue of 6 shards over a
    Cluster."""
    shards = 6 if sharded else 1
    if sharded:
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        cluster.flush()  # (the session's Cluster: other tests may have left messages)
        url = cluster.url
    else:
        url = request.getfixturevalue("redis_server").url
    queue = queue_for(settings, url, RETRY_COUNT=0, SHARDS=shards)
    message_id = queue.send({"do": "postpone-times", "times": 3})
    worker = spawn(workers, url, DQ_TEST_RETRY_COUNT="0", DQ_TEST_SHARDS=str(shards), **HANDLER)
    [done] = wait_for(lambda: events("done"), timeout=30, what="the message handled")
    starts = events("start")
    assert done["id"] == message_id
    assert len(starts) == 4  # postponed three times, then handled
    assert {entry["attempt"] for entry in starts} == {1}
    stats = queue.stats()
    assert stats["postponed_total"] == 3
    assert (stats["failed_total"], stats["garbage"]) == (0, 0)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_endless_postpones_end_as_a_dead_letter_with_their_reason(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url)
    message_id = queue.send({"do": "postpone"})
    worker = spawn(workers, redis_server.url, **HANDLER)
    [dead] = wait_for(lambda: events("dead"), timeout=60, what="the dead letter")
    assert (dead["id"], dead["reason"]) == (message_id, POSTPONED_TOO_OFTEN)
    # The default MAX_POSTPONES (100), then the postpone that buried it.
    assert len(events("start")) == 101
    assert {entry["attempt"] for entry in events("start")} == {1}
    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.state, stored.dead_reason) == ("garbage", POSTPONED_TOO_OFTEN)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
