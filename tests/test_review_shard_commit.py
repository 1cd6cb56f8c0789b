"""Review: a commit held back because its shard's master was away is tried again soon
after SHARD_RETRY_SECONDS, not at the consumer's next unrelated wake-up."""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.engine.sharded_store import ShardedStore
from delayqueue_django.engine.shards import shard_keys, shard_name
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.test_shard_outage import on_shard
from tests.test_worker_processes import WorkerProcess, events
from tests.worker_handlers import LOG_KEY

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(3, 0, "--cluster-require-full-coverage", "no")
    yield servers
    servers.close()


def test_a_held_commit_is_tried_again_once_its_shard_is_back(
    settings: Any, cluster: RedisClusterServers
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": cluster.url, "SHARDS": 6}}
    queue = get_queue()
    store = queue.store
    assert isinstance(store, ShardedStore)
    spared = {cluster.master_for(LOG_KEY), cluster.master_for(store.keys.tag), cluster.nodes[0]}
    doomed: RedisServer = next(node for node in cluster.nodes if node not in spared)
    names = [shard_name(6, index) for index in range(1, 6)]
    down = [
        name
        for name in names
        if cluster.master_for(shard_keys(store.keys, 6, int(name.split(".")[-1])).tag) is doomed
    ]
    assert down
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
