"""The metrics history (issue #35): the bytes one queue's history takes in Redis when its
14 days are full, every field of every record in use (BullMQ's figure: about 120 KB a
queue for two weeks per minute).

Redis's clock cannot be moved, so the records of 15 days are written as the scripts write
them (BITFIELD, every field of every minute), then the workers' housekeeping
(prune_throughput) rolls all but the last day up into hour records, as it would have hour
by hour; what stands then is measured with MEMORY USAGE, key by key."""

from typing import Any

from benchmarks.report import Row
from delayqueue_django import get_queue
from delayqueue_django.engine.metrics import RECORD
from delayqueue_django.engine.sharding.store import parts

HOUR_MS = 3_600_000
# Large values, so that no field is left small: counts in the millions, lags of minutes.
RECORD_VALUES = (1_000_000, 900_000, 50_000, 1_000, 500, 950_000, 600_000, 10**12)


def fill(probe: Any) -> int:
    """A queue's history filled for 15 days, then rolled up as the housekeeping does;
    returns its bytes in Redis (MEMORY USAGE of each history key, added up)."""
    probe.flushall()
    queue = get_queue()
    store = parts(queue.store)["0"]
    now_hour = store.metrics(0).now_ms // HOUR_MS
    record = RECORD.pack(*RECORD_VALUES)
    pipe = probe.pipeline(transaction=False)
    for hour in range(now_hour - 15 * 24, now_hour + 1):
        pipe.set(store.keys.key(f"metrics:m:{hour}"), record * 60)
    pipe.execute()
    queue.prune_throughput()
    names = probe.keys(store.keys.key("metrics:*"))
    return sum(probe.memory_usage(name, samples=0) for name in names)


def rows(measured: list[int]) -> list[Row]:
    return [
        Row(
            "metrics history: bytes per queue for 14 days (the last day per minute, then "
            "per hour; every field in use)",
            [float(b) for b in measured],
            "bytes",
            target="< 120,000 (BullMQ's per-minute two weeks)",
        )
    ]
