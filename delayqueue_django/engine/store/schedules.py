"""A ``RedisStore``'s schedule records (schedule.lua, schedules.lua): read, define, tick,
pause, resume, retire and report failures."""

from collections.abc import Sequence
from typing import Any

from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.records import (
    LONGEST_FAILURE_REASON,
    ScheduleFailure,
    ScheduleListing,
    ScheduleRecord,
    ScheduleReply,
    Tick,
    parse_schedule_record,
)
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.replies import _id, _optional_shown, _text


class RedisSchedules(RedisStoreBase):
    """The queue's schedules, as delayqueue_django.schedules keeps them."""

    def read_schedules(self) -> ScheduleListing:
        return self._read_schedules([])

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        _, records = self._read_schedules([wire(name)])
        return records[0] if records else None

    def _read_schedules(self, args: Sequence[Any]) -> ScheduleListing:
        now, flat, _ = self._run("schedules", args, extra_keys=self.keys.schedule_keys)
        records = [
            parse_schedule_record(
                _id(flat[i]),
                _optional_shown(flat[i + 1]),
                _optional_shown(flat[i + 2]),
                _optional_shown(flat[i + 3]),
            )
            for i in range(0, len(flat), 4)
        ]
        return int(now), records

    def _schedule(
        self,
        op: str,
        name: str,
        *,
        fingerprint: str = "",
        definition: str = "",
        expect: str = "any",
        start_ms: int = 0,
        tick: Tick | None = None,
    ) -> ScheduleReply:
        args = [op, self._channel, wire(name), fingerprint, definition, expect, start_ms]
        args += [0, 0, ""] if tick is None else [tick.at_ms, tick.budget, tick.payload]
        status, cursor, tick_ms, previous, now, _ = self._run(
            "schedule", args, extra_keys=self.keys.schedule_keys
        )
        return ScheduleReply(_text(status), int(cursor), int(tick_ms), int(previous), int(now))

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        return self._schedule("tick", name, fingerprint=fingerprint, tick=tick)

    def define_schedule(
        self,
        name: str,
        definition: str,
        fingerprint: str,
        *,
        expect: str,
        start_ms: int,
        first: Tick | None,
    ) -> ScheduleReply:
        return self._schedule(
            "put",
            name,
            fingerprint=fingerprint,
            definition=definition,
            expect=expect,
            start_ms=start_ms,
            tick=first,
        )

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        return self._schedule("pause", name, start_ms=start_ms)

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        return self._schedule(
            "resume", name, fingerprint=fingerprint, start_ms=start_ms, tick=first
        )

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        return self._schedule("remove", name, fingerprint=fingerprint)

    def declare_schedule(self, name: str) -> ScheduleReply:
        return self._schedule("declare", name)

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        return self._schedule("retire", name, fingerprint=fingerprint, start_ms=undeclared_ms)

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        return self._schedule(
            "fail",
            name,
            fingerprint=fingerprint,
            definition=failure.reason[:LONGEST_FAILURE_REASON],
            start_ms=failure.since_ms,
        )
