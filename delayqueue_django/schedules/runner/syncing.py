"""The store's schedules as this worker sees them, read again every REFRESH_MS, and the
schedules of settings kept the union of what running workers declare (stored at start,
declared at every read, removed once none has declared them for UNDECLARED_MS). Apart
from writing ticks, which reads the view this keeps."""

import functools
import logging

from delayqueue_django.engine.records import ScheduleRecord, loggable
from delayqueue_django.schedules.definition import SETTINGS, Schedule
from delayqueue_django.schedules.option import declared_schedules
from delayqueue_django.schedules.runner.failures import RunnerFailures
from delayqueue_django.schedules.runner.state import _known_of, _source

logger = logging.getLogger("delayqueue_django.schedules")

# Schedules added, changed or resumed by other processes are seen by the ticks they write
# (see declines); this re-read is the safety net.
REFRESH_MS = 30_000
# A schedule of settings that no running worker has declared (has in its SCHEDULES) for this
# long is removed: ten refreshes, so that after a deploy every kind of worker has declared
# its own again, and a worker cut off from Redis for a moment keeps its schedules.
UNDECLARED_MS = 300_000


class RunnerSyncing(RunnerFailures):
    """Reading the store's schedules; syncing and declaring the settings' ones."""

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
