"""Writing outbox rows: without Redis (a Redis Cluster whose seed master hangs), in chunks
a database server accepts (send_many of many large messages), and read by the relay
through an index (rows of other queues waiting)."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django.engine.shards import SHARD_MARK, shard_of
from delayqueue_django.models import OutboxMessage
from tests.databases import database_params, subprocess_settings
from tests.redis_servers import RedisClusterServers, RedisServer

ROOT = Path(__file__).resolve().parent.parent

# What a web process does: one order's transaction sending through the outbox.
SEND_IN_A_FRESH_PROCESS = """
import django, json
django.setup()
from django.db import transaction
import delayqueue_django as delayqueue
with transaction.atomic():
    ids = delayqueue.get_queue().send_many([{"order": n} for n in range(20)], outbox=True)
print(json.dumps(ids))
"""


@pytest.fixture(params=database_params())
def database(request: pytest.FixtureRequest, settings: Any) -> str:
    """The database alias under test, the outbox's only database."""
    alias: str = request.param
    settings.DELAYQUEUE_OUTBOX_DATABASES = [alias]
    return alias


def run_settings(alias: str, queues: dict[str, Any]) -> dict[str, str]:
    """The environment of a process using ``queues`` and the test database ``alias``."""
    config = {
        "DELAYQUEUES": queues,
        "DATABASES": subprocess_settings(alias),
        "DELAYQUEUE_OUTBOX_DATABASES": ["default"],
    }
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
        "DQ_CHAOS_SETTINGS": json.dumps(config),
    }


@pytest.fixture
def paused(redis_cluster: RedisClusterServers) -> Iterator[RedisServer]:
    """The cluster's seed master (the node its URL names) stopped with SIGSTOP: it accepts
    connections and answers nothing, as a master that hangs. Resumed after the test, which
    then waits for the cluster to be whole again (the other nodes may have failed it)."""
    seed = redis_cluster.nodes[0]
    assert seed.process is not None
    seed.process.send_signal(signal.SIGSTOP)
    try:
        yield seed
    finally:
        seed.process.send_signal(signal.SIGCONT)
        for node in redis_cluster.nodes:
            client = node.client(socket_timeout=1)
            deadline = time.monotonic() + 30
            while client.cluster("info")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, f"cluster node {node.port} stays failed"
                time.sleep(0.05)
            client.close()


@pytest.mark.parametrize("shards", [1, 6])
def test_an_outbox_send_needs_no_redis_on_a_cluster_whose_seed_master_hangs(
    database: str, redis_cluster: RedisClusterServers, paused: RedisServer, shards: int
) -> None:
    """Building the queue's client would ask the paused master for the cluster's slots
    and fail after its socket timeout, rolling the caller's transaction back."""
    queues = {"default": {"URL": redis_cluster.url, "OUTBOX": True, "SHARDS": shards}}
    done = subprocess.run(
        [sys.executable, "-c", SEND_IN_A_FRESH_PROCESS],
        env=run_settings(database, queues),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sent = json.loads(done.stdout)
    written = OutboxMessage.objects.using(database).order_by("id")
    assert [row.message_id for row in written] == sent
    # Each id names a shard of the settings' layout, chosen without Redis.
    assert {shard_of(message_id)[0] for message_id in sent if SHARD_MARK in message_id} <= {shards}
