"""A worker of a sharded queue with one master down: that master's shards wait, the others
keep flowing, commits included."""

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import RedisError

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.sharding.placement import shard_keys, shard_name, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from tests.helpers import asked_for_stats, wait_for
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.test_worker_processes import WorkerProcess, events
from tests.worker_handlers import LOG_KEY

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    # The other masters serve their slots while one is down.
    servers = RedisClusterServers(3, 0, "--cluster-require-full-coverage", "no")
    yield servers
    servers.close()


def on_shard(queue: Queue, name: str, payload: dict[str, Any], retries: int = 3) -> str:
    """Send ``payload`` to shard ``name`` (the id it gets there names that shard), with
    this many retries."""
    store = queue.store
    assert isinstance(store, ShardedStore)
    message_id = next(
        placed
        for placed in store.place([f"{uuid.uuid4().hex}" for _ in range(1000)])
        if shard_name(*shard_of(placed)) == name
    )
    store.send([NewMessage(message_id, json.dumps(payload), retries, at_ms=0)])
    return message_id


def doomed_master(
    settings: Any, cluster: RedisClusterServers
) -> tuple[Queue, RedisServer, list[str], list[str]]:
    """A queue of 6 shards on the cluster; a master that holds neither the test's log nor
    shard 0 (nor is the entry node), to be failed; the shards it holds, and the others."""
    settings.DELAYQUEUES = {"default": {"URL": cluster.url, "SHARDS": 6}}
    queue = get_queue()
    store = queue.store
    assert isinstance(store, ShardedStore)
    spared = {cluster.master_for(LOG_KEY), cluster.master_for(store.keys.tag), cluster.nodes[0]}
    doomed: RedisServer = next(node for node in cluster.nodes if node not in spared)
    names = [shard_name(6, index) for index in range(6)]
    tags = {name: shard_keys(store.keys, 6, int(name.split(".")[-1])).tag for name in names[1:]}
    down = [name for name, tag in tags.items() if cluster.master_for(tag) is doomed]
    assert down
    return queue, doomed, down, [name for name in names if name not in down]


def fail(master: RedisServer, fault: str) -> None:
    """Make ``master`` fail its shards' calls: gone (``down``), or there and answering with
    a refusal (``refusing``: its default user may no longer write, as a master refuses
    writes with MISCONF when its disk is full)."""
    if fault == "down":
        master.crash()
    else:
        master.client().acl_setuser("default", reset=False, enabled=True, commands=["-@write"])


@pytest.mark.parametrize("fault", ["down", "refusing"])
def test_a_worker_commits_on_the_other_shards_while_one_master_fails(
    settings: Any, cluster: RedisClusterServers, fault: str
) -> None:
    """One worker, one handler thread: a message of the doomed master's shard is being
    handled when that master dies (or starts refusing), so its ack cannot be committed.
    The messages of the other shards that follow are handled and acked all the same (the
    acked signal fires after the commit), rather than wait in line behind the ack that
    fails."""
    queue, doomed, down, up = doomed_master(settings, cluster)

    worker = WorkerProcess(
        cluster.url, "--concurrency", "1", DQ_TEST_SHARDS="6", DQ_TEST_MAX_CONSUME="60"
    )
    try:
        worker.wait_for_line("queue 'default'")
        slow = on_shard(queue, down[0], {"do": "sleep", "seconds": 1.0})
        wait_for(lambda: any(e["id"] == slow for e in events("start")), timeout=10, what="start")
        fail(doomed, fault)
        others = [on_shard(queue, up[n % len(up)], {"n": n}) for n in range(10)]

        wait_for(
            lambda: {e["id"] for e in events("acked")} >= set(others),
            timeout=15,
            what=f"the other shards' messages acked\n{worker.output}",
        )
        assert slow not in {e["id"] for e in events("acked")}
        assert "shard " + down[0] in worker.output
    finally:
        worker.stop()


def test_fetches_and_exhaustion_claims_pass_over_the_shards_of_a_master_down(
    settings: Any, shards_down: list[str]
) -> None:
    queue = get_queue()
    up = [name for name in parts(queue.store) if name not in shards_down]
    sent = {on_shard(queue, name, {"shard": name}, retries=0) for name in up}

    fetched = queue.fetch(100)  # (the shards down are asked first too, by turns)

    assert {message.id for message in fetched.messages} == sent
    queue.nack(fetched.messages)  # no retries: each a dead letter, its exhaustion owed
    claims = queue.claim_exhausted(100)
    assert {claim.id for claim in claims} == sent


def test_a_new_layout_takes_a_pause_on_the_shards_up_while_a_master_is_down(
    settings: Any, shards_down: list[str]
) -> None:
    # The layout's registration copies shard 0's pause to its shards: the copy to those
    # down fails, which must hold up only writes to them, not to the others.
    queue = get_queue()
    store = queue.store
    assert isinstance(store, ShardedStore)
    store.base.flow("pause")  # (on shard 0 alone, as a pause() that reached no other)
    up = [name for name in parts(store) if name not in shards_down and name != "0"]
    sent = on_shard(queue, up[0], {"n": 1})
    assert queue.peek(sent) is not None
    assert queue.fetch(10).messages == []  # the shard up took the pause
    with pytest.raises((RedisError, OSError)):
        on_shard(queue, shards_down[0], {"n": 2})


def test_a_held_commit_is_tried_again_once_its_shard_is_back(
    settings: Any, cluster: RedisClusterServers
) -> None:
    queue, doomed, down, _ = doomed_master(settings, cluster)
    # Heartbeats far apart: nothing else wakes the idle consumer for a minute.
    worker = WorkerProcess(
        cluster.url,
        "--concurrency",
        "1",
        "--heartbeat",
        "60",
        DQ_TEST_SHARDS="6",
        DQ_TEST_MAX_CONSUME="60",
    )
    try:
        worker.wait_for_line("queue 'default'")
        slow = on_shard(queue, down[0], {"do": "sleep", "seconds": 1.5})
        wait_for(lambda: any(e["id"] == slow for e in events("start")), timeout=10, what="start")
        doomed.crash()
        # The handler returns; its ack cannot be committed: held for its shard.
        time.sleep(3)
        doomed.start()
        back = time.monotonic()
        # Whatever the restarted master says of the ack (its data went with the crash),
        # the worker must ask it within a few seconds of its return.
        wait_for(
            lambda: (
                "came after its delivery timed out" in worker.output
                or any(e["id"] == slow for e in events("acked"))
            ),
            timeout=10,
            what=f"the held ack committed\n{worker.output}",
        )
        assert time.monotonic() - back < 10
    finally:
        worker.stop()


def test_stats_add_up_the_shards_that_answer_and_count_those_down(
    settings: Any, shards_down: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = get_queue()
    stores = parts(queue.store)
    up = [name for name in stores if name not in shards_down]
    for name in up:
        on_shard(queue, name, {"shard": name})
    asked = asked_for_stats(monkeypatch)

    stats = queue.stats()

    assert (stats["pending"], stats["due"], stats["shards_down"]) == (len(up), len(up), 2)
    # Both shards down are on one master: the second is not asked (on a server that does
    # not answer, it would wait out a socket timeout of its own).
    assert [tag for tag in asked if tag in {stores[name].keys.tag for name in shards_down}] == [
        stores[shards_down[0]].keys.tag
    ]
    assert len(asked) == len(up) + 1


def test_a_pause_reaches_every_shard_up_while_a_master_is_down(
    settings: Any, shards_down: list[str]
) -> None:
    # The shards after one down in the copy's order got no pause: it stopped at the first.
    queue = get_queue()
    up = [name for name in parts(queue.store) if name not in shards_down and name != "0"]
    sent = [on_shard(queue, name, {"shard": name}) for name in up]
    with pytest.raises((RedisError, OSError)):
        queue.pause()
    assert queue.fetch(100).messages == []  # every shard up paused
    assert all(queue.peek(message_id) is not None for message_id in sent)
