"""A worker's share of a queue's schedules: no scheduler process, no lock.

Every worker of a queue keeps each of its schedules one tick ahead: when the waiting tick
falls due (it is being handed out), the worker writes the next one. Any number of workers
do so at the same moment; ``schedule.lua`` writes a tick only if it is later than the
schedule's cursor, so the first write of each tick time wins and the others are told where
the cursor is. A worker killed at any point leaves either the tick written (the others see
it) or not (the others write it): never none, never two.

Ticks no worker wrote in time (all workers down, say) are "missed"; so is a tick that
starts more than ``MISSED_AFTER`` after its time. The schedule's ``MISSED`` policy decides
what happens to them: ``skip`` them all, run ``once`` for all of them, or run ``all`` of
them, up to ``MISSED_LIMIT`` (the latest ones). The worker applies it twice: when it catches
up (which ticks it writes) and when a tick is handed out late (whether the handler runs: see
``declines``).

The schedules of settings are the union of what running workers declare: each worker
stores its own as it starts, declares them again at every read of the schedules (storing
again one Redis lost), and removes one no worker has declared for UNDECLARED_MS; it never
removes one just because its own settings lack it (see _keep_settings).

Each schedule is handled on its own: one that fails for a reason of its own (a TASK whose
queue no Tasks backend carries, a stored definition no longer readable, any exception
building its tick) is logged, recorded in the store for the admin and ``schedules.all()``
to show, and tried again later, while the queue's other schedules go on firing. Only a
Redis error (an outage) stops the whole pass.
"""

import functools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from delayqueue_django.core import features
from delayqueue_django.core.encoding import encode_payload
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import (
    ScheduleFailure,
    ScheduleRecord,
    Tick,
    loggable,
    parse_tick_id,
)
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import SETTINGS, RecentTicks, Schedule
from delayqueue_django.schedules.option import declared_schedules

logger = logging.getLogger("delayqueue_django.schedules")

# Schedules added, changed or resumed by other processes are seen by the ticks they write
# (see declines); this re-read is the safety net.
REFRESH_MS = 30_000
# After a failed write (Redis away, out of memory), wait this long before the next try.
RETRY_MS = 1_000
# A schedule of settings that no running worker has declared (has in its SCHEDULES) for this
# long is removed: ten refreshes, so that after a deploy every kind of worker has declared
# its own again, and a worker cut off from Redis for a moment keeps its schedules.
UNDECLARED_MS = 300_000
# Ticks written per schedule in one turn while catching up (MISSED "all"); the next turn
# goes on at once.
CATCH_UP_BATCH = 100
# The missed ticks a catch-up skips (beyond MISSED_LIMIT) are counted for the log; a cron
# expression's tick by tick, up to this many (about 50 ms).
SKIPPED_COUNT_LIMIT = 1000
# A schedule that fails is tried again after FAILED_RETRY_MS, then after twice as long each
# time, up to FAILED_RETRY_MAX_MS. It is logged when it starts failing, when the reason
# changes, and every FAILURE_LOG_MS while it goes on (not at every try).
FAILED_RETRY_MS = 5_000
FAILED_RETRY_MAX_MS = 300_000
FAILURE_LOG_MS = 900_000


@dataclass(frozen=True)
class Known:
    """A schedule as this worker last saw it in the store."""

    schedule: Schedule
    fingerprint: str
    paused: bool
    cursor_ms: int
    tick_ms: int
    # Its tick record is missing or unreadable (damage): the next turn defines it afresh.
    damaged: bool = False

    @property
    def act_at_ms(self) -> float:
        """When the next tick is to be written: as the waiting one falls due, or at once if
        none is waiting; never while paused or while the store's record is not for this
        definition (the next refresh sorts that out)."""
        if self.paused or self.fingerprint != self.schedule.fingerprint:
            return math.inf
        return self.cursor_ms if self.tick_ms > 0 else -math.inf


@dataclass
class Failing:
    """A schedule this worker could not handle: why, since when (ms, the store's clock), and
    when to try again."""

    fingerprint: str
    reason: str
    since_ms: int
    tries: int
    retry_at_ms: float
    logged_at_ms: float = -math.inf
    # Recorded in the store (report_schedule_failure) since it was last logged.
    reported: bool = False


def tick_payload(schedule: Schedule, queue: str, at_ms: int, now_ms: int) -> str:
    """What the tick at ``at_ms`` carries: the schedule's payload, or a call of its task
    due then (on the first DelayQueueBackend whose QUEUES list the queue)."""
    if schedule.task is None:
        return schedule.payload
    tasks = features.tasks()
    payload = (
        None
        if tasks is None
        else tasks.call_payload(
            features.TaskCallSpec(
                task=schedule.task,
                queue=queue,
                args=schedule.args,
                kwargs=schedule.kwargs,
                enqueued_at=_moment(now_ms),
                run_after=_moment(at_ms),
            )
        )
    )
    if payload is None:
        raise InvalidSchedule(
            f"schedule {schedule.name!r} runs task {schedule.task!r}, but no "
            f"DelayQueueBackend in TASKS carries queue {queue!r}",
            "E049",
        )
    return encode_payload(payload, max_bytes=2**31, queue=queue)


def _moment(ms: int) -> datetime:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


class ScheduleRunner:
    """One queue's schedules in one worker. ``run_due`` is called from the queue's consumer
    loop; ``declines`` judges its ticks as they are handed out. Thread-safe."""

    def __init__(self, queue: Queue, on_news: Callable[[], None] | None = None) -> None:
        self.queue = queue
        self._lock = threading.RLock()
        # Set when a tick handed out showed a schedule this worker did not know, or knew in
        # an older state (added, changed or resumed elsewhere): its next tick is this
        # worker's to write now, not at its next planned turn (up to REFRESH_MS away).
        # ``on_news`` (called from the handler thread) wakes whoever calls run_due.
        self._news = False
        self._on_news = on_news
        self._known: dict[str, Known] = {}
        self._synced = False
        self._refresh_at = -math.inf
        self._retry_at = -math.inf
        # The latest store clock a reply showed: the clock is at least there.
        self._now_ms = 0
        # Schedules that failed, by name: passed over until their retry time, or until their
        # definition changes (another fingerprint).
        self._failing: dict[str, Failing] = {}
        # Each schedule's latest ticks as the clock moves, by name: which missed ticks are
        # too old to run (see _earliest_to_run).
        self._recent: dict[str, RecentTicks] = {}
        # When this worker first synced its settings (ms, the store's clock): it retires
        # undeclared schedules only once it has itself run UNDECLARED_MS.
        self._first_sync_ms: int | None = None
        # This worker's settings' schedules it saw in the store at its last refresh: one
        # gone since was removed by hand, or Redis lost its data.
        self._seen_stored: set[str] = set()
        # The schedules added at run time (the API, the admin) last seen stored: no worker
        # can store them again, so their loss with Redis's data is said by name.
        self._seen_added: set[str] = set()

    def schedules(self) -> list[Known]:
        with self._lock:
            return list(self._known.values())

    def has_news(self) -> bool:
        """Whether run_due is wanted now, whatever it last returned (see _noticed)."""
        return self._news

    def read_again(self) -> None:
        """This worker lost its connection to Redis: the next pass reads the schedules at
        once (a pass that fails is tried again, reading them, after RETRY_MS), as Redis
        may answer again without its data (restarted empty, failed over to an empty
        replica); the settings' ones are then stored again."""
        with self._lock:
            self._refresh_at = -math.inf
            self._retry_at = -math.inf
            self._news = True

    # Writing ticks

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

    def _sync_settings(self) -> None:
        """The queue's SCHEDULES into the store: new and changed ones put (a changed one's
        waiting tick replaced); unchanged ones, and every schedule added at run time, left
        as they are. A schedule of settings that this worker's settings lack is left to the
        workers that declare it (see _keep_settings). A schedule whose first tick cannot be
        built is put without it (and reported failing): the admin shows it, and the workers
        try its ticks again later."""
        now, records = self.queue.store.read_schedules()
        self._seen(now)
        self._first_sync_ms = now
        stored = {record.name: record for record in records}
        declared = {schedule.name: schedule for schedule in declared_schedules(self.queue.config)}
        for schedule in declared.values():
            record = stored.get(schedule.name)
            if record is None or record.definition != schedule.to_json():
                put = functools.partial(self._put, schedule, now)
                self._isolated(schedule.name, schedule.fingerprint, now, put)
        for record in self._undeclared(records):
            logger.info(
                "schedule %s of queue %s is not in this worker's settings: left to the "
                "workers that declare it (removed once none has for %d s)",
                loggable(record.name),
                self.queue.name,
                UNDECLARED_MS // 1000,
            )

    def _undeclared(self, records: list[ScheduleRecord]) -> list[ScheduleRecord]:
        """The schedules of settings among ``records`` that this worker's settings lack."""
        declared = {schedule.name for schedule in declared_schedules(self.queue.config)}
        return [
            record
            for record in records
            if record.name not in declared
            and record.definition is not None
            and _source(record) == SETTINGS
        ]

    def _keep_settings(self, now: int, records: list[ScheduleRecord]) -> bool:
        """Keep the store's schedules of settings the union of what running workers
        declare: declare each of this worker's (storing again one the store lost), and
        remove the others once no worker has declared them for UNDECLARED_MS (and this
        worker has run that long). True if it changed which schedules the store holds."""
        changed = False
        missing = []
        for schedule in declared_schedules(self.queue.config):
            if self.queue.store.declare_schedule(schedule.name).status == "missing":
                missing.append(schedule)
        lost = [schedule.name for schedule in missing if schedule.name in self._seen_stored]
        if lost and not records:
            logger.warning(
                "queue %s has no schedules in Redis any more, though this worker saw %d of "
                "its settings' there: Redis lost its data (restarted without persistence, "
                "failed over to an empty replica, flushed); storing them again",
                self.queue.name,
                len(lost),
            )
            if self._seen_added:
                logger.warning(
                    "queue %s: the schedule(s) %s, added at run time, went with Redis's data "
                    "and no worker can store them again: add them again",
                    self.queue.name,
                    ", ".join(loggable(name) for name in sorted(self._seen_added)),
                )
        elif lost:
            logger.warning(
                "schedule(s) %s of queue %s, in this worker's settings, went from Redis "
                "(removed by hand, or Redis lost its data): stored again",
                ", ".join(loggable(name) for name in lost),
                self.queue.name,
            )
        for schedule in missing:
            put = functools.partial(self._put, schedule, now, expect="new")
            self._isolated(schedule.name, schedule.fingerprint, now, put)
            self.queue.store.declare_schedule(schedule.name)
            changed = True
        if self._first_sync_ms is not None and now - self._first_sync_ms >= UNDECLARED_MS:
            changed |= self._retire_undeclared(records)
        return changed

    def _retire_undeclared(self, records: list[ScheduleRecord]) -> bool:
        """Remove the schedules of settings no running worker has declared for
        UNDECLARED_MS (atomically in the store: one declared meanwhile stays); True if any
        was."""
        retired = False
        for record in self._undeclared(records):
            # Any fingerprint ("") if its tick record is damaged.
            fingerprint = record.fingerprint or ""
            reply = self.queue.store.retire_schedule(record.name, fingerprint, UNDECLARED_MS)
            if reply.status == "removed":
                retired = True
                logger.info(
                    "schedule %s of queue %s is in no running worker's settings (none "
                    "declared it for %d s): removed",
                    loggable(record.name),
                    self.queue.name,
                    UNDECLARED_MS // 1000,
                )
        return retired

    def _put(self, schedule: Schedule, now: int, *, expect: str = "any") -> None:
        """Put a schedule declared in settings (``expect`` as define_schedule takes it)."""
        try:
            first, problem = self._first_tick(schedule, now), None
        except Exception as error:  # reported once the schedule is stored
            first, problem = None, error
        reply = self.queue.store.define_schedule(
            schedule.name,
            schedule.to_json(),
            schedule.fingerprint,
            expect=expect,
            start_ms=now,
            first=first,
        )
        logger.info(
            "schedule %s of queue %s from settings: %s (%s)",
            loggable(schedule.name),
            self.queue.name,
            reply.status,
            schedule.describe(),
        )
        if problem is not None:
            self._failed(schedule.name, schedule.fingerprint, problem, now)

    def _first_tick(self, schedule: Schedule, now: int) -> Tick | None:
        at = schedule.next_after(now)
        return None if at is None else self._tick(schedule, at)

    def _tick(self, schedule: Schedule, at: int) -> Tick:
        payload = tick_payload(schedule, self.queue.name, at, self._now_ms)
        return Tick(at, self.queue.config.retry_count, payload)

    def _refresh(self) -> None:
        now, records = self.queue.store.read_schedules()
        self._seen(now)
        if self._keep_settings(now, records):
            now, records = self.queue.store.read_schedules()
            self._seen(now)
        declared = {schedule.name for schedule in declared_schedules(self.queue.config)}
        self._seen_stored = {r.name for r in records if r.definition and r.name in declared}
        self._seen_added = {
            r.name
            for r in records
            if r.definition and r.name not in declared and _source(r) != SETTINGS
        }
        self._refresh_at = now + REFRESH_MS
        known = {}
        for record in records:
            if record.definition is None:
                continue  # the tick record of a removed schedule: nothing to follow
            try:
                schedule = Schedule.from_json(record.name, record.definition)
            except Exception as error:  # a foreign write, or an older version's
                self._failed(record.name, record.fingerprint or "", error, now)
                continue
            known[record.name] = _known_of(record, schedule)
        self._known = known
        # Failures of schedules since removed are forgotten.
        names = {record.name for record in records}
        self._failing = {name: f for name, f in self._failing.items() if name in names}
        self._recent = {name: r for name, r in self._recent.items() if name in known}

    def _catch_up(self, name: str, now: float) -> None:
        known = self._known.get(name)
        if known is not None and self._act_at_ms(known) <= now:
            self._isolated(name, known.fingerprint, now, lambda: self._write_ticks(name, now))

    def _isolated(self, name: str, fingerprint: str, now: float, step: Callable[[], None]) -> None:
        """One schedule's step: an error of its own is that schedule's failure, the others
        go on; a Redis error (Redis away, out of memory) is everyone's, and stops the pass."""
        try:
            step()
        except RedisError:
            raise
        except Exception as error:
            self._failed(name, fingerprint, error, now)

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

    def _earliest_to_run(self, schedule: Schedule, now: int) -> int | None:
        """The earliest of the latest ``missed_runs`` ticks due by ``now``: of a run of
        missed ticks, it and those after it run; None if no tick is due."""
        with self._lock:
            recent = self._recent.get(schedule.name)
            if recent is None or recent.schedule != schedule:
                recent = self._recent[schedule.name] = RecentTicks(schedule, schedule.missed_runs)
            return recent.earliest(now)

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

    def _seen(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)

    def _failed(self, name: str, fingerprint: str, error: Exception, now: float) -> None:
        """A schedule failed: tried again after a backoff; logged (and recorded in the store,
        for the admin and ``schedules.all()``) as it starts failing, as its reason changes,
        and every FAILURE_LOG_MS while it lasts."""
        reason = _reason(error)
        before = self._failing.get(name)
        if before is None or before.fingerprint != fingerprint:
            before = Failing(fingerprint, reason, int(now), 0, -math.inf)
        tries = before.tries + 1
        backoff = min(FAILED_RETRY_MS * 2 ** min(tries - 1, 16), FAILED_RETRY_MAX_MS)
        failing = replace(before, reason=reason, tries=tries, retry_at_ms=now + backoff)
        self._failing[name] = failing
        if reason != before.reason or now - before.logged_at_ms >= FAILURE_LOG_MS:
            failing.logged_at_ms, failing.reported = now, False
            logger.error(
                "schedule %s of queue %s fails (tried %d time(s) since %s; passed over, tried "
                "again in %d s, while the queue's other schedules go on): %s",
                loggable(name),
                self.queue.name,
                tries,
                _moment(failing.since_ms).isoformat(),
                backoff // 1000,
                loggable(reason),
                exc_info=None if isinstance(error, InvalidSchedule) else error,
            )
        if not failing.reported and fingerprint:
            self.queue.store.report_schedule_failure(
                name, fingerprint, ScheduleFailure(reason, failing.since_ms)
            )
            failing.reported = True

    def _recovered(self, name: str) -> None:
        failing = self._failing.pop(name, None)
        if failing is not None:
            logger.info(
                "schedule %s of queue %s fires again (it failed %d time(s): %s)",
                loggable(name),
                self.queue.name,
                failing.tries,
                loggable(failing.reason),
            )

    # Running ticks

    @staticmethod
    def may_decline(message: Message) -> bool:
        """Whether ``message`` is a tick's first delivery, the only kind ``declines`` judges
        (by the id alone: no read)."""
        return message.attempt == 1 and parse_tick_id(message.id) is not None

    def declines(self, message: Message) -> bool:
        """Whether ``message`` is a tick not to run: the worker acks it without running its
        handler (this logs why). The tick's schedule is read from the store as the tick is
        handed out (one read per tick, none for other messages), and the tick is not run if:

        - its schedule was removed, or is paused;
        - it was written before the schedule was added or last resumed (its ``since``): a
          tick of a schedule of that name since removed, or one written before a pause.
          So a pause or a removal stops every tick not handed out yet, however many wait,
          with no search for them in the queue;
        - it counts as missed and the schedule's MISSED policy drops it. A tick is missed
          when its first delivery starts more than MISSED_AFTER after its time (no worker
          ran then, or the queue was that far behind). ``skip`` drops every missed tick;
          ``once`` runs a missed tick only if no later tick of the schedule has come due
          by then (so of a run of missed ticks, the last one runs); ``all`` runs it only
          if fewer than MISSED_LIMIT later ticks have (so the last MISSED_LIMIT run).

        Retries and redeliveries always run: their first delivery started. A tick whose
        schedule cannot be read (Redis away) runs, as it would have with no schedule left
        to judge it.
        """
        parsed = parse_tick_id(message.id)
        if parsed is None or message.attempt != 1:
            return False
        name, at = parsed
        reason = self._why_not_run(name, at, message)
        if reason is None:
            return False
        logger.info("tick %s of queue %s not run: %s", loggable(message.id), message.queue, reason)
        return True

    def _why_not_run(self, name: str, at: int, message: Message) -> str | None:
        """Why the tick of schedule ``name`` at ``at`` that ``message`` hands out is not to
        run (see declines), or None if it runs."""
        try:
            record = self.queue.store.read_schedule(name)
        except Exception:  # a tick is run even when its schedule cannot be read
            logger.warning(
                "reading schedule %s of queue %s failed: its tick %s runs unchecked",
                loggable(name),
                self.queue.name,
                loggable(message.id),
                exc_info=True,
            )
            return None
        if record is None or record.definition is None:
            return "its schedule was removed"
        schedule = self._noticed(record)
        if record.paused:
            return "its schedule is paused"
        if record.fingerprint is not None and at <= record.since_ms:
            return (
                "it was written before its schedule was paused or removed (the schedule "
                f"runs ticks after {_moment(record.since_ms).isoformat()} only)"
            )
        if schedule is None or not self._dropped(schedule, at, message):
            return None
        missed = schedule.missed
        if missed == "all":
            missed = f"all, MISSED_LIMIT={schedule.missed_limit}"
        late = (self._started_ms(message) - at) / 1000
        return f"missed (started {late:.1f} s after its time; MISSED={missed})"

    def _started_ms(self, message: Message) -> int:
        # Handed out (on the store's clock) one MAX_CONSUME_DURATION before its deadline.
        return message.deadline_ms - self.queue.config.max_consume_ms

    def _dropped(self, schedule: Schedule, at: int, message: Message) -> bool:
        started = self._started_ms(message)
        if started - at <= schedule.missed_after_ms:
            return False
        if schedule.missed == "skip":
            return True
        earliest = self._earliest_to_run(schedule, started)
        return earliest is not None and at < earliest

    def _noticed(self, record: ScheduleRecord) -> Schedule | None:
        """A tick of a schedule was handed out, and the schedule read with it: its
        definition (None if it does not read). This worker takes what it read for its own
        view if it did not know the schedule or knew an older state of it (the tick of a
        schedule added, changed or resumed elsewhere), so that it writes the next ticks
        too."""
        with self._lock:
            known = self._known.get(record.name)
            if known is not None and known.schedule.to_json() == record.definition:
                schedule = known.schedule
            else:
                try:
                    schedule = Schedule.from_json(record.name, record.definition or "")
                except InvalidSchedule:  # the next refresh reports it
                    return None
            fresh = _known_of(record, schedule)
            if (
                known is None
                or (known.schedule, known.fingerprint, known.paused)
                != (fresh.schedule, fresh.fingerprint, fresh.paused)
                or known.cursor_ms < fresh.cursor_ms
            ):
                self._known[record.name] = fresh
                self._news = True
                if self._on_news is not None:
                    self._on_news()
            return schedule


def _known_of(record: ScheduleRecord, schedule: Schedule) -> Known:
    """A schedule as its record in the store stands, its definition read."""
    if record.fingerprint is None:
        # Its tick record is missing, or unreadable as schedule.lua reads it.
        return Known(schedule, schedule.fingerprint, False, 0, 0, True)
    return Known(schedule, record.fingerprint, record.paused, record.cursor_ms, record.tick_ms)


def _reason(error: Exception) -> str:
    """A failure as the admin shows it: an InvalidSchedule says it all; another error is
    named by its type too (a KeyError's message alone is just the key)."""
    if isinstance(error, InvalidSchedule):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _source(record: ScheduleRecord) -> str | None:
    try:
        return Schedule.from_json(record.name, record.definition or "").source
    except InvalidSchedule:
        return None
