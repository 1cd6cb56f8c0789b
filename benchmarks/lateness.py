"""Lateness: messages with delays spread over a few seconds while a worker process runs;
how long after its due time each handler started."""

import time
from datetime import UTC, datetime
from pathlib import Path

from delayqueue_django import get_queue


def lateness_ms(count: int, spread: float, results: Path) -> list[float]:
    """Send ``count`` messages due over ``spread`` seconds (from 0.2 s from now), each sent
    ahead of its due time as a view would, and read the worker's record of how late each
    handler started (``benchmarks.handlers.record_lateness`` writes ``results``)."""
    queue = get_queue()
    step = spread / count
    start = time.time() + 0.2
    for n in range(count):
        # Due times on whole ms, so the payload's due time is exactly the one Redis keeps.
        due_ms = round((start + n * step) * 1000)
        queue.send({"due_ms": due_ms}, at=datetime.fromtimestamp(due_ms / 1000, UTC))
        # Sends trail ahead of the due times, interleaved with the deliveries.
        time.sleep(step / 4)
    deadline = time.monotonic() + spread + 30
    while _lines(results) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_lines(results)} of {count} messages were handled")
        time.sleep(0.05)
    return [float(line) for line in results.read_text().split()]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0
