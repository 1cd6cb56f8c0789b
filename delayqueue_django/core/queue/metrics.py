"""``Queue.metrics``: the queue's metrics history (see engine.metrics), as a series of
counts per step of time, and ``Queue.throughput`` read from it."""

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from asgiref.sync import sync_to_async

from delayqueue_django.core.queue.base import QueueBase, _reaching_redis
from delayqueue_django.engine.metrics import (
    EMPTY,
    HOURS_KEPT_DAYS,
    MINUTE_MS,
    Counts,
    MetricsRead,
    throughput_rows,
)

# How far ``throughput`` reaches: the admin's bars and the benchmarks read 15 to 60 minutes.
THROUGHPUT_MINUTES_KEPT = 60
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Metrics:
    """One step of a queue's metrics history (see ``Queue.metrics``): from ``start`` (an
    aware datetime, UTC, on Redis's clock), the messages sent, the deliveries acked,
    refused to be tried again (``nacked``: a retry, a postpone, a keyed message superseded,
    a delivery that timed out), ``dead`` (buried: retries used up, rejected, postponed too
    often), ``expired`` (dead-lettered as their expiry passed), and ``handed`` out, with the
    average and largest lag (ms) of those handed out after their due time (None when none
    was)."""

    start: datetime
    sent: int
    acked: int
    nacked: int
    dead: int
    expired: int
    handed: int
    lag_avg_ms: float | None
    lag_max_ms: int | None


def series(read: MetricsRead, since_minute: int, step_minutes: int) -> list[Metrics]:
    """The steps from the one holding ``since_minute`` to the current one, each adding up
    the entries that start in it: an hour record (the history beyond the last day) falls
    whole in the step holding its first minute."""
    first = since_minute // step_minutes
    last = read.current_minute // step_minutes
    sums = [EMPTY] * (last - first + 1)
    for entry in read.entries:
        index = entry.minute // step_minutes - first
        if 0 <= index < len(sums):
            sums[index] = sums[index].plus(entry.counts)
    return [_metrics((first + i) * step_minutes, counts) for i, counts in enumerate(sums)]


def _metrics(minute: int, counts: Counts) -> Metrics:
    handed = counts.handed
    return Metrics(
        start=datetime.fromtimestamp(minute * MINUTE_MS / 1000, tz=UTC),
        sent=counts.sent,
        acked=counts.acked,
        nacked=counts.nacked,
        dead=counts.dead,
        expired=counts.expired,
        handed=handed,
        lag_avg_ms=counts.lag_sum / handed if handed else None,
        lag_max_ms=counts.lag_max if handed else None,
    )


class QueueMetrics(QueueBase):
    """The metrics history."""

    @_reaching_redis
    def metrics(
        self,
        since: datetime | timedelta = timedelta(hours=1),
        step: timedelta = MINUTE,
    ) -> list[Metrics]:
        """The queue's metrics history, oldest first: one ``Metrics`` per ``step`` (a whole
        number of minutes, 1 by default; a coarser step adds its minutes up), from the step
        holding ``since`` to the current one, steps with nothing in them included. Steps
        start at multiples of ``step`` since the epoch (UTC). ``since`` is a moment (an
        aware datetime) or how long ago (a timedelta, 1 hour by default), on Redis's clock.

        The history keeps each minute for a day and each hour for 14 days: further back a
        step finer than an hour finds each hour's counts in the step holding its first
        minute; before 14 days, nothing. One round trip (one per shard of a sharded queue,
        whose shards' counts are added up)."""
        step_minutes, remainder = divmod(step, MINUTE)
        if remainder or step_minutes < 1:
            raise ValueError(f"step must be a whole number of minutes, not {step!r}")
        if isinstance(since, datetime):
            if since.tzinfo is None:
                raise ValueError("since must be an aware datetime (or a timedelta)")
            since_ms = since.timestamp() * 1000
            back = math.ceil((datetime.now(UTC).timestamp() * 1000 - since_ms) / MINUTE_MS)
            read = self.store.metrics(max(back, 0) + step_minutes + 1)
            since_minute = math.floor(since_ms / MINUTE_MS)
        else:
            if since < timedelta(0):
                raise ValueError(f"since must not be negative, not {since!r}")
            back = math.ceil(since / MINUTE) - 1 if since > timedelta(0) else 0
            read = self.store.metrics(back + step_minutes)
            since_minute = read.current_minute - back
        oldest = read.current_minute - (HOURS_KEPT_DAYS + 1) * 24 * 60
        return series(read, max(since_minute, oldest), step_minutes)

    async def ametrics(
        self,
        since: datetime | timedelta = timedelta(hours=1),
        step: timedelta = MINUTE,
    ) -> list[Metrics]:
        """``metrics`` for async code (the sync store's, in a worker thread)."""
        return await sync_to_async(self.metrics, thread_sensitive=False)(since, step)

    @_reaching_redis
    def throughput(self, minutes: int = 15) -> list[tuple[int, int, int]]:
        """Acked and failed deliveries per minute: ``(minute_start_ms, acked, failed)`` for
        the last ``minutes`` minutes (Redis clock), oldest first, in one round trip; failed
        adds up the nacked, dead and expired of ``metrics``."""
        if not 1 <= minutes <= THROUGHPUT_MINUTES_KEPT:
            raise ValueError(f"minutes must be 1..{THROUGHPUT_MINUTES_KEPT}, not {minutes}")
        return throughput_rows(self.store.metrics(minutes), minutes)

    @_reaching_redis
    def prune_throughput(self) -> int:
        """The metrics history's upkeep, which the workers' housekeeping runs: minute
        records older than a day rolled up per hour (see ``metrics``)."""
        return self.store.prune_throughput()
