"""A worker of a sharded queue with one master paused (SIGSTOP: its sockets hang until the
timeout): the fetches stop waiting on it, and the other shards' messages are handled at
their pace for the whole pause, none redelivered."""

import json
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.sharding.hangs import FETCH_PATIENCE_SECONDS
from delayqueue_django.engine.sharding.placement import shard_name, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers
from tests.test_shard_outage import doomed_master
from tests.test_worker_processes import WorkerProcess, events

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

# How long the master stays paused, and how often a message is sent to the other shards
# meanwhile (due at once).
PAUSE_SECONDS = 8.0
SEND_EVERY_SECONDS = 0.1
# The most a message of a healthy shard may wait past its due time: one fetch's patience
# with the hung shard, and some room for a loaded machine. The socket timeout (5 s) is far.
LATE_LIMIT_SECONDS = FETCH_PATIENCE_SECONDS + 0.5


def ids_on(store: ShardedStore, names: list[str], count: int) -> list[str]:
    """``count`` message ids placed on the shards ``names``, in turn over them."""
    placed = store.place([uuid.uuid4().hex for _ in range(40 * count)])
    by_shard = {name: [i for i in placed if shard_name(*shard_of(i)) == name] for name in names}
    return [by_shard[names[n % len(names)]][n // len(names)] for n in range(count)]


def test_the_other_shards_are_handled_at_their_pace_while_a_master_is_paused(
    settings: Any, cluster: RedisClusterServers
) -> None:
    """Before: each fetch that asked the paused master's shards (again every
    SHARD_RETRY_SECONDS) waited out the socket timeout there, with the deliveries it had
    already taken from the other shards, whose messages came up to 5 s late and, past
    MAX_CONSUME_DURATION (3 s), were delivered again."""
    queue, paused, down, up = doomed_master(settings, cluster)
    store = queue.store
    assert isinstance(store, ShardedStore)
    assert paused.process is not None
    worker = WorkerProcess(
        cluster.url, "--concurrency", "4", DQ_TEST_SHARDS="6", DQ_TEST_MAX_CONSUME="3"
    )
    healthy_ids = ids_on(store, up, int(PAUSE_SECONDS / SEND_EVERY_SECONDS))
    try:
        worker.wait_for_line("queue 'default'")
        # One message handled first: the worker's housekeeping at its start (garbage
        # expiry on every shard, once a minute) is over before the pause.
        warm_up = ids_on(store, up, 1)
        store.send([NewMessage(warm_up[0], json.dumps({"n": 0}), 3, at_ms=0)])
        wait_for(lambda: any(e["id"] == warm_up[0] for e in events("acked")), what="warm-up")
        # Due a second into the pause: the worker's fetches ask the paused shards then.
        held = ids_on(store, down, 4)
        store.send([NewMessage(i, json.dumps({"held": True}), 3, delay_us=1_500_000) for i in held])
        paused.process.send_signal(signal.SIGSTOP)
        sent_at: dict[str, float] = {}
        next_send = time.monotonic()
        for message_id in healthy_ids:
            time.sleep(max(next_send - time.monotonic(), 0))
            next_send += SEND_EVERY_SECONDS
            before = time.time()
            store.send([NewMessage(message_id, json.dumps({"n": 1}), 3, at_ms=0)])
            sent_at[message_id] = before
        wait_for(
            lambda: {e["id"] for e in events("start")} >= set(healthy_ids),
            timeout=10,
            what=f"the other shards' messages handled\n{worker.output}",
        )
        paused.process.send_signal(signal.SIGCONT)
        wait_for(
            lambda: {e["id"] for e in events("acked")} >= set(healthy_ids) | set(held),
            timeout=30,
            what=f"every message handled after the pause\n{worker.output}",
        )
        starts = events("start")
        late = {e["id"]: e["at"] - sent_at[e["id"]] for e in starts if e["id"] in sent_at}
        worst = max(late, key=late.__getitem__)
        assert late[worst] < LATE_LIMIT_SECONDS, (
            f"{worst} started {late[worst]:.1f} s after its send; "
            f"{sum(v > LATE_LIMIT_SECONDS for v in late.values())} of {len(late)} that late"
            f"\n{worker.output}"
        )
        again = [i for i, n in Counter(e["id"] for e in starts).items() if n > 1]
        assert again == [], f"{len(again)} delivered again"
        assert "did not answer in time" in worker.output
        assert "answers again" in worker.output
    finally:
        paused.process.send_signal(signal.SIGCONT)
        worker.stop()
