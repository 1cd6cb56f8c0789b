"""Histograms of handler durations and delivery lateness, measured by workers and added up
in Redis, so that the figures of every worker process sum correctly.

A worker counts observations per bucket in memory and adds them to the queue's running
totals (``RedisStore.add_totals``) with each heartbeat and when it stops; the Prometheus
collector reads them back. Buckets are fixed here, so every process agrees on them.
"""

import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

# Upper bounds in seconds; a last, unbounded bucket catches the rest.
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "handler_duration": (
        *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
        *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
    ),
    "delivery_lateness": (
        *(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
        *(1.0, 2.5, 5.0, 10.0, 60.0, 300.0),
    ),
    # How long an async handler held the worker's event loop, each time it held it past
    # DELAYQUEUE_LOOP_BLOCKED_AFTER (see worker.loop_watch): nothing for sync handlers.
    "event_loop_blocked": (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
}


# Each histogram's total names, made once: per bucket (the last one unbounded), count, sum.
_NAMES = {
    name: [
        *(f"{name}:{bucket}" for bucket in range(len(bounds) + 1)),
        f"{name}:count",
        f"{name}:sum_us",
    ]
    for name, bounds in HISTOGRAMS.items()
}

_HANDLER_BOUNDS = HISTOGRAMS["handler_duration"]
_LATENESS_BOUNDS = HISTOGRAMS["delivery_lateness"]


class Timings:
    """Observations not yet added to Redis. Thread-safe: handler threads observe, the
    consumer drains.

    Workers observe every message, so observations are tallied in plain lists (one slot per
    bucket, then count and sum, in ``_NAMES`` order) and named only when drained."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies = _empty_tallies()
        # What a failed flush handed back, by name (see restore).
        self._restored: Counter[str] = Counter()

    def observe(self, histogram: str, seconds: float) -> None:
        with self._lock:
            self._add(histogram, seconds)

    def observe_delivery(self, handler_seconds: float, lateness_seconds: float | None) -> None:
        """A handled delivery's duration and, when its due time is known, its lateness:
        both under one lock, as workers do it for every message (``_add`` inlined)."""
        with self._lock:
            tally = self._tallies["handler_duration"]
            tally[bisect_left(_HANDLER_BOUNDS, handler_seconds)] += 1
            tally[-2] += 1
            tally[-1] += round(handler_seconds * 1_000_000)
            if lateness_seconds is not None:
                tally = self._tallies["delivery_lateness"]
                tally[bisect_left(_LATENESS_BOUNDS, lateness_seconds)] += 1
                tally[-2] += 1
                tally[-1] += round(lateness_seconds * 1_000_000)

    def _add(self, histogram: str, seconds: float) -> None:
        tally = self._tallies[histogram]
        tally[bisect_left(HISTOGRAMS[histogram], seconds)] += 1
        tally[-2] += 1
        # Integer microseconds: Redis adds integers exactly.
        tally[-1] += round(seconds * 1_000_000)

    def drain(self) -> dict[str, int]:
        """Every count observed (or restored) since the last drain, by total name."""
        with self._lock:
            tallies, self._tallies = self._tallies, _empty_tallies()
            totals, self._restored = self._restored, Counter()
        for histogram, tally in tallies.items():
            for name, value in zip(_NAMES[histogram], tally, strict=True):
                if value:
                    totals[name] += value
        return dict(totals)

    def restore(self, increments: Mapping[str, int]) -> None:
        """Put back what could not be added (Redis was away), to try again later."""
        with self._lock:
            self._restored.update(increments)


def _empty_tallies() -> dict[str, list[int]]:
    return {name: [0] * len(names) for name, names in _NAMES.items()}


@dataclass(frozen=True, slots=True)
class Histogram:
    # (upper bound, observations at or below it), cumulative, ending with +Inf.
    buckets: list[tuple[float, int]]
    count: int
    sum_seconds: float


def histogram_from_totals(totals: Mapping[str, int], histogram: str) -> Histogram:
    bounds = (*HISTOGRAMS[histogram], float("inf"))
    cumulative, running = [], 0
    for index, bound in enumerate(bounds):
        running += totals.get(f"{histogram}:{index}", 0)
        cumulative.append((bound, running))
    return Histogram(
        buckets=cumulative,
        count=totals.get(f"{histogram}:count", 0),
        sum_seconds=totals.get(f"{histogram}:sum_us", 0) / 1_000_000,
    )
