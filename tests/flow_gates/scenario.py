"""The flow gates with real workers: three ``run_delayqueue`` processes drain a backlog
under a rate limit, under a cap, or through a pause; the ledger their handler writes says
when each delivery was handed out and when it ran."""

import time
from pathlib import Path
from typing import Any

from delayqueue_django.core.queue import Queue
from tests.chaos.fleet import WorkerFleet
from tests.keys_race import journal

HANDLER = "tests.flow_gates.handler.handle"
CONSUME_MS = 5000
HANDLER_SECONDS = 0.05


def worker_settings(url: str, **options: Any) -> dict[str, Any]:
    queue = {
        "URL": url,
        "HANDLER": HANDLER,
        "MAX_CONSUME_DURATION": CONSUME_MS / 1000,
        **options,
    }
    return {"DELAYQUEUES": {"default": queue}}


def drain(queue: Queue, fleet: WorkerFleet, count: int, timeout: float) -> list[dict[str, Any]]:
    """Wait until ``count`` messages were handled (the ledger) and the queue is empty."""
    deadline = time.monotonic() + timeout
    while True:
        records = journal.read(fleet.ledger)
        stats = queue.stats()
        handled = {record["id"] for record in records}
        if len(handled) >= count and stats["pending"] + stats["unack"] + stats["ready"] == 0:
            return records
        assert time.monotonic() < deadline, f"{len(handled)} of {count} handled:\n{fleet.output()}"
        time.sleep(0.1)


def busiest_window(times_ms: list[int], period_ms: int) -> int:
    """The most hand-outs in any window (t - period, t]: what the sliding window bounds."""
    ordered = sorted(times_ms)
    most, start = 0, 0
    for end, time_ms in enumerate(ordered):
        while ordered[start] <= time_ms - period_ms:
            start += 1
        most = max(most, end - start + 1)
    return most


def most_at_once(records: list[dict[str, Any]]) -> int:
    """The most handlers running at one instant, over every worker."""
    events = sorted(
        [(record["started"], 1) for record in records]
        + [(record["ended"], -1) for record in records]
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def ledger_of(folder: Path) -> list[dict[str, Any]]:
    return journal.read(folder)
