"""A sharded queue whose shard 0 hangs: the register of layouts lives there, and its
refresh must not hold back writes to the shards of the other masters."""

import itertools
import logging
import signal
import time
from typing import Any

import pytest

import delayqueue_django as delayqueue
from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.sharding import layouts as shard_layouts
from delayqueue_django.engine.sharding.placement import shard_keys, shard_suffix
from delayqueue_django.engine.sharding.store import ShardedStore
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_hung_shard_0_does_not_hold_back_sends_to_the_other_masters_shards(
    settings: Any,
    cluster: RedisClusterServers,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SHARDS 6 on 3 masters, the master of shard 0 paused (its socket hangs until the
    timeout; the package's defaults: 5 s, and redis-py's retries), every write due to
    refresh the register. Before: a failed refresh was not recorded, so each send to a
    healthy shard waited out the timeout on shard 0 first."""
    timeout = 5.0  # the package's socket timeout
    monkeypatch.setattr(shard_layouts, "LAYOUT_REGISTER_SECONDS", 0.0)
    settings.DELAYQUEUES = {"default": {"URL": cluster.url, "SHARDS": 6}}
    queue = delayqueue.get_queue()
    store = queue.store
    assert isinstance(store, ShardedStore)
    base = cluster.master_for(store.keys.tag)
    assert base.process is not None
    healthy = [
        index
        for index in range(1, 6)
        if cluster.master_for(shard_keys(store.keys, 6, index).tag) is not base
    ]
    assert healthy
    numbers = itertools.count()

    def send_to_a_healthy_shard() -> float:
        """Send one message to a shard of a master that answers: how long it took."""
        number = next(numbers)
        message_id = f"m{number}{shard_suffix(6, healthy[number % len(healthy)])}"
        started = time.monotonic()
        store.send([NewMessage(message_id, "{}", 0)])
        return time.monotonic() - started

    def refresh_failed() -> bool:
        return any("registering layout 6 failed" in r.getMessage() for r in caplog.records)

    # Registers layout 6 while shard 0 answers; one send to each healthy shard, whose store
    # asks every node's version at its first call (a hung master is not what this tests).
    for _ in healthy:
        send_to_a_healthy_shard()
    store.base.retire_layout(6)  # as a hasty operator would
    caplog.set_level(logging.DEBUG, logger="delayqueue_django.engine")
    base.process.send_signal(signal.SIGSTOP)

    first = send_to_a_healthy_shard()  # the first refresh attempt, which hangs
    assert first < timeout / 2, f"the send that found the register due took {first:.1f} s"
    # Sends while that attempt hangs, until it fails, and on for a few of its backoffs
    # (each attempt after the backoff is started by a send).
    took = []
    while not refresh_failed():
        took.append(send_to_a_healthy_shard())
        time.sleep(0.05)
    retries_until = time.monotonic() + 3 * shard_layouts.SHARD_RETRY_SECONDS
    while time.monotonic() < retries_until:
        took.append(send_to_a_healthy_shard())
        time.sleep(0.05)
    slowest = max(took)
    assert slowest < timeout / 2, f"{len(took)} sends, the slowest took {slowest:.1f} s"

    # Shard 0 answers again: a refresh puts the retired layout back on the register.
    base.process.send_signal(signal.SIGCONT)
    wait_for(
        lambda: send_to_a_healthy_shard() >= 0 and store.base.layouts() == {6},
        timeout=4 * timeout,
        what="layout 6 registered again",
    )
    assert queue.stats()["pending"] == next(numbers)
