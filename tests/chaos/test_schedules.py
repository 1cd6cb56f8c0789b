"""A 1-second schedule under kill -9: four worker processes, one killed at random moments and
restarted. Every second's tick is handled (counted by tick time), and none twice: a second
handling of a tick only ever comes from a worker killed before its ack."""

import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import parse_tick_id
from tests.chaos import ledger
from tests.chaos.conftest import queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.ledger import Entry
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.chaos

WORKERS = 4
# A killed worker's tick comes back after this, as a redelivery (attempt 2).
CONSUME_SECONDS = 2


def by_tick_second(entries: list[Entry]) -> dict[int, list[Entry]]:
    found: dict[int, list[Entry]] = defaultdict(list)
    for entry in entries:
        parsed = parse_tick_id(entry.id)
        assert parsed is not None, entry
        found[parsed[1] // 1000].append(entry)
    return found


def test_a_one_second_schedule_fires_every_tick_once_while_workers_are_killed(
    redis_server: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_schedule_seconds: int,
) -> None:
    config = queue_settings(
        redis_server.url,
        MAX_CONSUME_DURATION=CONSUME_SECONDS,
        SCHEDULES={"every-second": {"EVERY": 1}},
    )
    queue = use_settings(config)
    rng = random.Random(1717)
    fleet = fleets(config, size=WORKERS)
    fleet.start()
    fleet.wait_started()
    started = time.time()
    while time.time() - started < chaos_schedule_seconds:
        time.sleep(rng.uniform(0.5, 4.0))
        fleet.kill_one(rng)
    ended = time.time()
    time.sleep(CONSUME_SECONDS + 2)  # the last victim's tick comes back meanwhile
    exit_codes = fleet.stop()
    entries = ledger.read(fleet.ledger)

    done = by_tick_second([entry for entry in entries if entry.event == "done"])
    expected = range(int(started) + 1, int(ended))
    missing = [second for second in expected if second not in done]
    # A tick time handled twice whose first handling was not cut short by a kill.
    twice = [
        second
        for second, runs in done.items()
        if any(run.pid not in fleet.killed for run in runs[:-1])
    ]
    redelivered = sum(len(runs) - 1 for runs in done.values())
    late = max((runs[0].time - second for second, runs in done.items()), default=None)
    report_figures(
        Figures(
            f"schedule every 1 s for {chaos_schedule_seconds} s: kill -9 of workers",
            len(expected),
            len(missing),
            len(twice),
            late,
            f"{WORKERS} workers, {len(fleet.killed)} kills; ticks handled again after a kill "
            f"(redelivered): {redelivered}; recovery: the longest a tick waited past its "
            "time to be handled",
        )
    )
    assert missing == [], fleet.output()
    assert twice == [], fleet.output()
    first_attempts = by_tick_second(
        [entry for entry in entries if entry.event == "start" and entry.attempt == 1]
    )
    assert all(len(runs) == 1 for runs in first_attempts.values())
    assert len(fleet.killed) >= 2
    assert set(exit_codes.values()) == {0}, fleet.output()
    assert queue.check_invariants().ok
