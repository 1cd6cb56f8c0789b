"""Soak with crashes: four worker processes, many messages with mixed delays, workers killed
with ``kill -9`` at random moments and restarted. Every message is handled at least once,
none is exhausted, and every duplicate comes from a delivery whose worker was killed; with a
sync handler (in each process's handler threads) and with an ``async def`` one (on each
process's event loop, up to the default --async-concurrency of 100 in flight)."""

import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Queue
from tests.chaos import ledger
from tests.chaos.accounting import WAITING_STATES, drain, tally
from tests.chaos.conftest import ASYNC_HANDLER, HANDLER, queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.ledger import Entry
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.chaos

WORKERS = 4
# Deliveries of a killed worker come back after this; long enough that a busy machine never
# makes a live worker overrun it (which would be a duplicate not caused by a kill).
CONSUME_SECONDS = 3


def mixed_delay(rng: random.Random, spread: float) -> float:
    """Due at once, within milliseconds, or anywhere in the next ``spread`` seconds."""
    kind = rng.random()
    if kind < 0.3:
        return 0
    if kind < 0.5:
        return rng.uniform(0, 0.05)
    return rng.uniform(0, spread)


def send_all(queue: Queue, count: int, rng: random.Random) -> list[str]:
    spread = max(count / 5000, 2.0)  # seconds over which the due times spread
    ids: list[str] = []
    for start in range(0, count, 1000):
        items = [
            Outgoing(
                {"n": n, "work_ms": rng.choice((0, 0, 0, 0, 1, 3))}, delay=mixed_delay(rng, spread)
            )
            for n in range(start, min(start + 1000, count))
        ]
        ids += queue.send_many(items)
    return ids


def killed_delivery_recovery(entries: list[Entry], killed: dict[int, float]) -> float | None:
    """The longest wait, after a kill, until a delivery the killed worker had started was
    handled by another worker."""
    by_id: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_id[entry.id].append(entry)
    longest = None
    for history in by_id.values():
        for entry in history:
            if entry.event != "start" or entry.pid not in killed:
                continue
            killed_at = killed[entry.pid]
            redone = [
                e.time
                for e in history
                if e.event == "done" and e.pid != entry.pid and e.time > killed_at
            ]
            if redone:
                wait = min(redone) - killed_at
                longest = wait if longest is None else max(longest, wait)
    return longest


def unexplained_duplicates(entries: list[Entry], killed: dict[int, float]) -> list[Entry]:
    """A message is handled again only when the worker that handled it was killed before its
    ack: every handling but the last must come from a killed worker, before its kill."""
    unexplained = []
    last_done: dict[str, Entry] = {}
    for entry in entries:
        if entry.event != "done":
            continue
        earlier = last_done.get(entry.id)
        if earlier is not None and not earlier.time <= killed.get(earlier.pid, -1):
            unexplained.append(earlier)
        last_done[entry.id] = entry
    return unexplained


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_workers_killed_at_random_lose_nothing(
    redis_server: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_messages: int,
    kind: str,
) -> None:
    handler = ASYNC_HANDLER if kind == "async" else HANDLER
    config = queue_settings(redis_server.url, HANDLER=handler, MAX_CONSUME_DURATION=CONSUME_SECONDS)
    queue = use_settings(config)
    rng = random.Random(2024)
    ids = send_all(queue, chaos_messages, rng)
    fleet = fleets(config, "--concurrency", "4", size=WORKERS)
    fleet.start()

    problems = []
    while any(queue.stats()[state] for state in WAITING_STATES):
        time.sleep(rng.uniform(0.2, 1.0))
        fleet.kill_one(rng)
        report = queue.check_invariants()  # mid-run, with workers busy
        problems += report.problems
    drain(queue, timeout=CONSUME_SECONDS * 4)
    exit_codes = fleet.stop()
    entries = ledger.read(fleet.ledger)
    result = tally(ids, entries)
    final = queue.check_invariants()

    report_figures(
        Figures(
            "soak: kill -9 of workers" + (", async handler" if kind == "async" else ""),
            len(ids),
            len(result.lost),
            result.duplicates,
            killed_delivery_recovery(entries, fleet.killed),
            f"{WORKERS} workers, {len(fleet.killed)} kills",
        )
    )
    assert len(fleet.killed) >= 2
    assert result.lost == [], fleet.output()
    assert problems == []
    assert final.ok, final.problems
    assert final.messages == 0  # nothing exhausted, nothing left behind
    assert set(exit_codes.values()) == {0}, fleet.output()
    assert unexplained_duplicates(entries, fleet.killed) == []
    assert "exhausted" not in fleet.log_text()
