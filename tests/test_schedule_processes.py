"""A schedule run by ``manage.py run_delayqueue`` processes on Redis, some killed with kill -9
at random moments and restarted: every tick fires, none twice. (The full-size run of the
same, four workers for five minutes: tests/chaos/test_schedules.py.)"""

import json
import random
import signal
import time
from collections import defaultdict
from typing import Any

import pytest

from delayqueue_django.engine.records import parse_tick_id
from tests.redis_servers import RedisServer
from tests.test_worker_processes import WorkerProcess, queue_for, spawn, workers  # noqa: F401
from tests.worker_handlers import read_log

pytestmark = pytest.mark.timeout(120)

SCHEDULES = {"poll": {"EVERY": 1}}
RUN_SECONDS = 12


def test_three_workers_killed_at_random_fire_every_tick_once(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url, SCHEDULES=SCHEDULES)
    env = {"DQ_TEST_SCHEDULES": json.dumps(SCHEDULES), "DQ_TEST_MAX_CONSUME": "2"}
    rng = random.Random(7)
    running = [spawn(workers, redis_server.url, **env) for _ in range(3)]
    for worker in running:
        worker.wait_for_line("queue 'default'")
    started = time.time()
    killed: dict[int, float] = {}
    while time.time() - started < RUN_SECONDS:
        time.sleep(rng.uniform(0.3, 1.5))
        victim = running.pop(rng.randrange(len(running)))
        victim.signal(signal.SIGKILL)
        victim.wait(timeout=10)
        killed[victim.pid] = time.time()
        running.append(spawn(workers, redis_server.url, **env))
    ended = time.time()
    time.sleep(3)  # deliveries of the last killed worker come back after 2 s
    for worker in running:
        worker.signal(signal.SIGTERM)
    for worker in running:
        assert worker.wait(timeout=20) == 0, worker.output

    starts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for entry in read_log():
        if entry["event"] == "start":
            parsed = parse_tick_id(entry["id"])
            assert parsed is not None, entry
            starts[parsed[1] // 1000].append(entry)
    # Every second from the first workers' start to the last kill has its tick.
    seconds = range(int(started) + 1, int(ended))
    assert [second for second in seconds if second not in starts] == []
    # Once: a second delivery of a tick only ever comes from a worker killed before it
    # acked (its deadline passed, attempt 2), never as a second tick of the same time.
    for entries in starts.values():
        first_attempts = [entry for entry in entries if entry["attempt"] == 1]
        assert len(first_attempts) <= 1, entries
        for earlier in entries[:-1]:
            assert earlier["pid"] in killed, entries
    assert len(killed) >= 6
    assert queue.check_invariants().ok
