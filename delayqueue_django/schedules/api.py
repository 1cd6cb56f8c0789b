"""``queue.schedules``: schedules added, changed, paused, resumed and removed at run time
(for schedules kept in a site's database, say), stored in Redis beside the queue.

Each call is a read and one atomic write (``schedule.lua``). A schedule added, changed or
resumed gets its first tick written by the call itself; the workers write the ticks after
it: the one that hands out the first tick reads the schedule with it and writes the next
at once (and every worker reads all schedules every 30 seconds).
"""

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from delayqueue_django.core.queue import Queue
from delayqueue_django.core.queue_schedules import ScheduleInfo
from delayqueue_django.engine.records import ScheduleRecord, ScheduleReply, Tick, tick_id
from delayqueue_django.exceptions import InvalidSchedule, UnknownSchedule
from delayqueue_django.schedules.definition import (
    API,
    OPTIONS,
    SETTINGS,
    Schedule,
    Subject,
    build,
)
from delayqueue_django.schedules.runner.state import tick_payload


def _as_datetime(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def describe(
    record: ScheduleRecord, schedule: Schedule | None, now: int, unreadable: str | None = None
) -> ScheduleInfo:
    """Where a schedule stands at ``now`` (ms); one whose definition cannot be read
    (``schedule`` None, ``unreadable`` why) only by the tick it may still wait on."""
    last = record.previous_ms or None
    written = record.tick_ms if record.tick_ms > now else None
    if record.tick_ms and record.tick_ms <= now:
        last = record.tick_ms
    upcoming = written
    if upcoming is None and not record.paused and schedule is not None:
        upcoming = schedule.next_after(max(record.cursor_ms, now))
    return ScheduleInfo(
        name=record.name,
        schedule=schedule,
        paused=record.paused,
        next_run=None if record.paused else _as_datetime(upcoming),
        next_id=None if written is None else tick_id(record.name, written),
        last_run=_as_datetime(last),
        failure=None if record.failure is None else record.failure.reason,
        failing_since=None if record.failure is None else _as_datetime(record.failure.since_ms),
        unreadable=unreadable,
    )


class Schedules:
    """The run-time API of one queue's schedules."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def all(self) -> list[ScheduleInfo]:
        """Every schedule of the queue, declared in settings or added at run time, by name.
        (Settings' schedules are stored when a worker starts.) One whose stored definition
        cannot be read is listed too, with ``unreadable`` saying why."""
        now, records = self.queue.store.read_schedules()
        return [found[1] for record in records if (found := self._info(record, now)) is not None]

    def get(self, name: str) -> ScheduleInfo:
        return self._find(name)[3]

    def add(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        payload: Any = None,
        time_zone: str | None = None,
        missed: str | None = None,
        missed_after: float | timedelta | None = None,
        missed_limit: int | None = None,
        task: str | None = None,
        args: list[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> ScheduleInfo:
        """A new schedule (the options are SCHEDULES', see the settings reference); its first
        tick is written at once. InvalidSchedule if the queue has one of that name already, or the
        definition is not valid."""
        options = _options(
            cron=cron,
            every=every,
            payload=payload,
            time_zone=time_zone,
            missed=missed,
            missed_after=missed_after,
            missed_limit=missed_limit,
            task=task,
            args=args,
            kwargs=kwargs,
        )
        if task is not None and payload is None:
            options.pop("PAYLOAD")
        schedule = self._build(name, options)
        now, _ = self.queue.store.read_schedules()
        reply = self._put(schedule, now, expect="new")
        if reply.status == "exists":
            raise InvalidSchedule(
                f"queue {self.queue.name!r} has a schedule named {name!r} already; change() it"
            )
        return self.get(name)

    def change(self, name: str, **changes: Any) -> ScheduleInfo:
        """Change a schedule added at run time: the keywords of ``add`` that are given
        replace the current ones (``cron`` replaces ``every`` and the other way round). The
        tick waiting under the old definition is replaced by the new definition's first.
        A schedule declared in settings is changed there."""
        unknown = sorted(set(changes) - {key.lower() for key in OPTIONS})
        if unknown:
            raise TypeError(f"change() got unexpected keyword(s) {', '.join(unknown)}")
        now, _, current = self._read(name)
        if current.source == SETTINGS:
            raise InvalidSchedule(
                f"schedule {name!r} of queue {self.queue.name!r} is declared in settings; "
                "change it there (workers apply it as they start)"
            )
        options = _options_of(current)
        if "cron" in changes:
            options.pop("EVERY", None)
        if "every" in changes:
            options.pop("CRON", None)
            options.pop("TIME_ZONE", None)
        if changes.get("task") is not None:
            options.pop("PAYLOAD", None)
        if changes.get("payload") is not None:
            for key in ("TASK", "ARGS", "KWARGS"):
                options.pop(key, None)
        if changes.get("missed") not in (None, "all"):
            options.pop("MISSED_LIMIT", None)  # MISSED "all"'s alone
        options.update(_options(**changes))
        schedule = self._build(name, options)
        if self._put(schedule, now, expect="existing").status == "missing":
            raise UnknownSchedule(f"queue {self.queue.name!r} has no schedule named {name!r}")
        return self.get(name)

    def pause(self, name: str) -> ScheduleInfo:
        """Fire nothing until resumed: no tick not handed out yet runs, however many wait
        (the waiting one is removed, the others are acked unrun as they are handed out);
        a tick already handed out runs to its end."""
        now, _, _ = self._read(name)
        self._expect(self.queue.store.pause_schedule(name, now), name)
        return self.get(name)

    def resume(self, name: str) -> ScheduleInfo:
        """Fire again, from the next tick after now; the ticks of the pause are not owed,
        and ticks written before it that still wait are not run."""
        while True:
            now, record, schedule = self._read(name)
            at = schedule.next_after(now)
            first = None if at is None else self._tick(schedule, at, now)
            fingerprint = record.fingerprint or ""
            reply = self.queue.store.resume_schedule(name, fingerprint, now, first)
            # "stale": changed since the read, so the first tick is the old definition's:
            # read it again.
            if reply.status != "stale":
                break
        self._expect(reply, name)
        return self.get(name)

    def remove(self, name: str) -> bool:
        """Remove a schedule: no tick of it not handed out yet runs, even if a schedule of
        that name is added again; False if there was none. A schedule declared in settings
        comes back within 30 s while a running worker declares it: remove it from settings
        (once no worker declares it, it goes by itself after 5 minutes)."""
        return self.queue.store.remove_schedule(name).status == "removed"

    # Helpers

    def _build(self, name: str, options: Mapping[str, Any]) -> Schedule:
        return build(
            name,
            options,
            subject=Subject(f"schedule {name!r} of queue {self.queue.name!r}", api=True),
            queue=self.queue.name,
            max_payload_bytes=self.queue.config.max_payload_bytes,
            default_time_zone=getattr(settings, "TIME_ZONE", None) or "UTC",
            source=API,
        )

    def _put(self, schedule: Schedule, now: int, *, expect: str) -> ScheduleReply:
        at = schedule.next_after(now)
        return self.queue.store.define_schedule(
            schedule.name,
            schedule.to_json(),
            schedule.fingerprint,
            expect=expect,
            start_ms=now,
            first=None if at is None else self._tick(schedule, at, now),
        )

    def _tick(self, schedule: Schedule, at: int, now: int) -> Tick:
        payload = tick_payload(schedule, self.queue.name, at, now)
        return Tick(at, self.queue.config.retry_count, payload)

    def _find(self, name: str) -> tuple[int, ScheduleRecord, Schedule | None, ScheduleInfo]:
        now, records = self.queue.store.read_schedules()
        for record in records:
            found = self._info(record, now) if record.name == name else None
            if found is not None:
                return now, record, *found
        raise UnknownSchedule(f"queue {self.queue.name!r} has no schedule named {name!r}")

    def _read(self, name: str) -> tuple[int, ScheduleRecord, Schedule]:
        """The schedule to act on; InvalidSchedule if its definition cannot be read."""
        now, record, schedule, info = self._find(name)
        if schedule is None:
            raise InvalidSchedule(f"{info.unreadable}; remove() it, then add() it again")
        return now, record, schedule

    def _info(
        self, record: ScheduleRecord, now: int
    ) -> tuple[Schedule | None, ScheduleInfo] | None:
        """The definition of the schedule of ``record`` (None if it cannot be read) and
        where the schedule stands; None if it is none: a record of ticks left without its
        definition, or a readable definition without its record of ticks (damage a worker
        repairs as it reads it). (The definition comes apart from the info, which the core
        types by what users read of a definition, for the calls that act on it.)"""
        if record.definition is None:
            return None
        try:
            schedule = Schedule.from_json(record.name, record.definition)
        except InvalidSchedule as error:
            return None, describe(record, None, now, unreadable=str(error))
        if record.fingerprint is None:
            return None
        return schedule, describe(record, schedule, now)

    def _expect(self, reply: ScheduleReply, name: str) -> None:
        if reply.status == "missing":
            raise UnknownSchedule(f"queue {self.queue.name!r} has no schedule named {name!r}")


def _options(**given: Any) -> dict[str, Any]:
    """Keyword arguments as SCHEDULES options; those not given (None) left out, so that
    their defaults apply, except PAYLOAD (None is a payload: JSON null)."""
    options = {key.upper(): value for key, value in given.items() if value is not None}
    if "payload" in given and given["payload"] is None:
        options["PAYLOAD"] = None
    return options


def _options_of(schedule: Schedule) -> dict[str, Any]:
    """A stored schedule's definition as SCHEDULES options."""
    options: dict[str, Any] = {
        "MISSED": schedule.missed,
        "MISSED_AFTER": schedule.missed_after_ms / 1000,
    }
    if schedule.missed == "all":
        options["MISSED_LIMIT"] = schedule.missed_limit
    if schedule.cron is not None:
        options["CRON"] = schedule.cron
        options["TIME_ZONE"] = schedule.time_zone
    else:
        options["EVERY"] = (schedule.every_ms or 0) / 1000
    if schedule.task is None:
        options["PAYLOAD"] = json.loads(schedule.payload)
    else:
        options.update(TASK=schedule.task, ARGS=schedule.args, KWARGS=schedule.kwargs)
    return options
