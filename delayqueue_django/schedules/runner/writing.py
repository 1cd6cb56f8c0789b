"""Writing ticks: each schedule kept one tick ahead, caught up under its MISSED policy, and
a damaged tick record defined afresh. ``run_due`` is the runner's pass, called from the
queue's consumer loop."""

import logging
import math
from dataclasses import replace

from delayqueue_django.engine.records import loggable
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner.state import Known, _moment
from delayqueue_django.schedules.runner.syncing import RunnerSyncing

logger = logging.getLogger("delayqueue_django.schedules")

# After a failed write (Redis away, out of memory), wait this long before the next try.
RETRY_MS = 1_000
# Ticks written per schedule in one turn while catching up (MISSED "all"); the next turn
# goes on at once.
CATCH_UP_BATCH = 100
# The missed ticks a catch-up skips (beyond MISSED_LIMIT) are counted for the log; a cron
# expression's tick by tick, up to this many (about 50 ms).
SKIPPED_COUNT_LIMIT = 1000


class RunnerWriting(RunnerSyncing):
    """A runner's pass: the settings synced, the schedules refreshed, the ticks written."""

    def run_due(self, now_estimate_ms: float) -> float:
        """Do what is due (the settings' sync first, a refresh, the ticks) and return when
        to be called next, on the store's clock (ms). Raises what the store raises (Redis
        errors); the next try then waits RETRY_MS. Any other error is one schedule's: it is
        passed over (see _failed) and the others go on."""
        with self._lock:
            self._news = False
            now = max(now_estimate_ms, self._now_ms)
            if now < self._retry_at:
                return self._retry_at
            if self._retry_at > -math.inf:
                # The last pass failed (Redis away): Redis may be back without its data
                # (restarted empty, failed over to an empty replica): read it all again.
                self._refresh_at = -math.inf
            self._retry_at = now + RETRY_MS
            if not self._synced:
                self._sync_settings()
                self._synced = True
            if now >= self._refresh_at:
                self._refresh()
                now = max(now, self._now_ms)
            for name in list(self._known):
                self._catch_up(name, now)
            self._retry_at = -math.inf
            return min([self._refresh_at, *map(self._act_at_ms, self._known.values())])

    def _act_at_ms(self, known: Known) -> float:
        """When to act on a schedule: a failing one at its retry time, not at its tick's,
        long past, which would have the consumer call again at once, forever."""
        failing = self._failing.get(known.schedule.name)
        if failing is None or failing.fingerprint != known.fingerprint:
            return known.act_at_ms
        return max(known.act_at_ms, failing.retry_at_ms)

    def _catch_up(self, name: str, now: float) -> None:
        known = self._known.get(name)
        if known is not None and self._act_at_ms(known) <= now:
            self._isolated(name, known.fingerprint, now, lambda: self._write_ticks(name, now))

    def _write_ticks(self, name: str, now: float) -> None:
        for _ in range(CATCH_UP_BATCH):
            known = self._known.get(name)
            if known is None or known.act_at_ms > now:
                return
            if known.damaged:
                self._define_afresh(known, int(now))
                continue
            schedule = known.schedule
            at = self._next_tick(schedule, known.cursor_ms, now)
            if at is None:
                # A cron that never fires again: nothing to write, ever.
                self._known[name] = replace(known, paused=True)
                return
            reply = self.queue.store.write_tick(name, known.fingerprint, self._tick(schedule, at))
            self._seen(reply.now_ms)
            if reply.status == "written" and schedule.missed == "all":
                self._log_skipped(schedule, known.cursor_ms, at)
            if reply.status in ("written", "behind"):
                self._recovered(name)
                self._known[name] = replace(known, cursor_ms=reply.cursor_ms, tick_ms=reply.tick_ms)
            elif reply.status == "paused":
                self._known[name] = replace(known, paused=True)
            else:  # "stale", "missing": changed or removed meanwhile
                self._refresh_at = -math.inf
                self._known.pop(name, None)
                return

    def _next_tick(self, schedule: Schedule, cursor: int, now: float) -> int | None:
        """The tick to write after the cursor, at ``now``: the next one, unless ticks were
        missed (no worker wrote them within MISSED_AFTER of their time)."""
        at = schedule.next_after(cursor)
        if at is None or at + schedule.missed_after_ms >= now:
            return at
        if schedule.missed == "skip":
            return schedule.next_after(int(now) - schedule.missed_after_ms - 1)
        # "once" and "all": the ticks before the latest MISSED_LIMIT (one, for "once") due by
        # now are skipped, never written.
        earliest = self._earliest_to_run(schedule, int(now))
        return at if earliest is None else max(at, earliest)

    def _log_skipped(self, schedule: Schedule, cursor: int, written: int) -> None:
        """A catch-up under MISSED "all" that skipped missed ticks beyond MISSED_LIMIT says
        so, once: in the worker whose write won."""
        first = schedule.next_after(cursor)
        if first is None or first >= written:
            return
        count = schedule.count_ticks(first, written, SKIPPED_COUNT_LIMIT)
        logger.warning(
            "schedule %s of queue %s missed more ticks than MISSED_LIMIT=%d: %s from %s to "
            "before %s skipped, the latest %d run",
            loggable(schedule.name),
            self.queue.name,
            schedule.missed_limit,
            f"more than {SKIPPED_COUNT_LIMIT}" if count is None else count,
            _moment(first).isoformat(),
            _moment(written).isoformat(),
            schedule.missed_limit,
        )

    def _define_afresh(self, known: Known, now: int) -> None:
        """A schedule whose tick record is damaged (missing, or unreadable: a number past
        2**53, say) is defined again from its definition, as new from now: the store takes
        it so too (schedule.lua), and would otherwise fire nothing."""
        schedule = known.schedule
        logger.warning(
            "schedule %s of queue %s has a damaged tick record (missing or unreadable): "
            "defined again, its ticks from now on",
            loggable(schedule.name),
            self.queue.name,
        )
        reply = self.queue.store.define_schedule(
            schedule.name,
            schedule.to_json(),
            schedule.fingerprint,
            expect="existing",
            start_ms=now,
            first=self._first_tick(schedule, now),
        )
        self._seen(reply.now_ms)
        if reply.status == "defined":
            self._recovered(schedule.name)
            self._known[schedule.name] = replace(
                known, cursor_ms=reply.cursor_ms, tick_ms=reply.tick_ms, damaged=False
            )
        else:  # "unchanged" (another worker did it first), "missing" (removed meanwhile)
            self._refresh_at = -math.inf
            self._known.pop(schedule.name, None)
