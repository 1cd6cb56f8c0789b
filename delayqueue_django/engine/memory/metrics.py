"""The memory store's metrics history, as the scripts count it (count_minute in
_prelude.lua): per minute for the last day, rolled up per hour by prune_throughput (see
MemoryOperators), each record a ``Counts``."""

from collections.abc import Sequence

from delayqueue_django.engine.memory.server import QueueState
from delayqueue_django.engine.metrics import (
    EMPTY,
    HOURS_KEPT_DAYS,
    MINUTE_MS,
    MINUTES_KEPT,
    READ_BACK_MINUTES,
    U32_MAX,
    Counts,
    Entry,
    MetricsRead,
)

DAY_MS = 86_400_000


def count_minute(state: QueueState, now: int, counts: Counts) -> None:
    """Adds to the metrics history's record of the minute of ``now`` (count_minute)."""
    if counts != EMPTY:
        minute = now // 60_000
        state.minute_records[minute] = state.minute_records.get(minute, EMPTY).plus(counts)


def handed_out(state: QueueState, now: int, dues: Sequence[int]) -> None:
    """Deliveries handed out at ``now``, and their lag after their due times (fetch.lua)."""
    if dues:
        lags = [max(now - due, 0) for due in dues]
        lag_max = min(max(lags), U32_MAX)
        count_minute(state, now, Counts(handed=len(dues), lag_max=lag_max, lag_sum=sum(lags)))


def read(state: QueueState, now: int, back_minutes: int) -> MetricsRead:
    """What metrics.lua reads: the minute records of every hour from ``back_minutes``
    before the current minute on (15 days back at most), and the hour records of every
    day from then on that have not expired."""
    current = now // MINUTE_MS
    first_hour = (current - min(max(back_minutes, 0), READ_BACK_MINUTES)) // 60
    first_day = first_hour // 24
    entries = [
        Entry(minute, 1, counts)
        for minute, counts in state.minute_records.items()
        if minute // 60 >= first_hour
    ]
    entries += [
        Entry(hour * 60, 60, counts)
        for hour, counts in state.hour_records.items()
        if hour // 24 >= first_day and not _hour_expired(hour, now)
    ]
    return MetricsRead(now, entries)


def prune(state: QueueState, now: int) -> int:
    """What prune_throughput.lua does: the minute records of each hour wholly older than a
    day, of the last 15 days, added up into its hour record; older ones dropped as their
    key's expiry would (15 days after their hour), and hour records 14 days after their
    day. Returns how many hours were rolled up."""
    current = now // MINUTE_MS
    oldest_minute = current - MINUTES_KEPT + 1
    first_hour, last_hour = current // 60 - 15 * 24, oldest_minute // 60 - 1
    rolled: set[int] = set()
    for minute in sorted(state.minute_records):
        hour = minute // 60
        if hour > last_hour:
            continue
        counts = state.minute_records.pop(minute)
        if hour >= first_hour:
            state.hour_records[hour] = state.hour_records.get(hour, EMPTY).plus(counts)
            rolled.add(hour)
    for hour in [hour for hour in state.hour_records if _hour_expired(hour, now)]:
        del state.hour_records[hour]
    return len(rolled)


def _hour_expired(hour: int, now: int) -> bool:
    """An hour record's day key expires 14 days after that day (PEXPIREAT)."""
    return now >= (hour // 24 + 1 + HOURS_KEPT_DAYS) * DAY_MS
