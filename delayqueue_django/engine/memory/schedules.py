"""Schedules on a memory queue, as schedule.lua and schedules.lua keep them."""

from delayqueue_django.engine.memory import prelude
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.server import Meta, QueueState, TickRecord
from delayqueue_django.engine.records import (
    LONGEST_FAILURE_REASON,
    ScheduleFailure,
    ScheduleListing,
    ScheduleRecord,
    ScheduleReply,
    Tick,
    tick_id,
)


class MemorySchedules(MemoryStoreBase):
    """Schedules' records and their ticks."""

    # Schedules (schedule.lua, schedules.lua)

    def read_schedules(self) -> ScheduleListing:
        with self.server.lock:
            state = self._state()
            names = sorted(state.schedules.keys() | state.schedule_ticks.keys())
            return self._now(), [prelude.schedule_record(state, name) for name in names]

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        with self.server.lock:
            state = self._state()
            if name not in state.schedules and name not in state.schedule_ticks:
                return None
            return prelude.schedule_record(state, name)

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.paused:
                return prelude.schedule_reply("paused", record, now)
            if record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            if tick.at_ms <= record.cursor:
                return prelude.schedule_reply("behind", record, now)
            self._write_tick(state, name, record, tick)
            state.schedule_failures.pop(name, None)
            return prelude.schedule_reply("written", record, now)

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
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            exists = record is not None or name in state.schedules
            if expect == "new" and exists:
                return prelude.schedule_reply("exists", record, now)
            if expect == "existing" and not exists:
                return prelude.schedule_reply("missing", record, now)
            state.schedules[name] = definition
            if record is not None and record.fingerprint == fingerprint:
                return prelude.schedule_reply("unchanged", record, now)
            if record is None:
                # New: ticks of a schedule of this name removed before are not its own.
                record = state.schedule_ticks[name] = TickRecord(fingerprint, since=start_ms)
            record.cursor = max(
                start_ms, prelude.drop_waiting_tick(state, name, record, due_too=False)
            )
            record.fingerprint = fingerprint
            if first is not None and first.at_ms > record.cursor and not record.paused:
                self._write_tick(state, name, record, first)
            state.schedule_failures.pop(name, None)
            return prelude.schedule_reply("defined", record, now)

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            record.cursor = max(
                start_ms, prelude.drop_waiting_tick(state, name, record, due_too=True)
            )
            record.paused = True
            return prelude.schedule_reply("paused", record, now)

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.paused and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            if record.paused:
                record.paused, record.since = False, start_ms
                record.cursor = max(start_ms, record.cursor)
                if first is not None and first.at_ms > record.cursor:
                    self._write_tick(state, name, record, first)
            return prelude.schedule_reply("resumed", record, now)

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            if record is not None and fingerprint and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            prelude.remove_schedule(state, name, record)
            return prelude.schedule_reply("removed", record, now)

    def declare_schedule(self, name: str) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            state.schedule_declared[name] = now
            return prelude.schedule_reply("declared", record, now)

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None and name not in state.schedules:
                return prelude.schedule_reply("missing", None, now)
            if record is not None and fingerprint and record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            declared = state.schedule_declared.get(name)
            if declared is None or declared > now:
                state.schedule_declared[name] = now
                return prelude.schedule_reply("declared", record, now)
            if now - declared < undeclared_ms:
                return prelude.schedule_reply("declared", record, now)
            prelude.remove_schedule(state, name, record)
            return prelude.schedule_reply("removed", record, now)

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        with self.server.lock:
            state, now = self._state(), self._now()
            record = state.schedule_ticks.get(name)
            if record is None:
                return prelude.schedule_reply("missing", None, now)
            if record.fingerprint != fingerprint:
                return prelude.schedule_reply("stale", record, now)
            reason = failure.reason[:LONGEST_FAILURE_REASON]
            state.schedule_failures[name] = ScheduleFailure(reason, failure.since_ms)
            return prelude.schedule_reply("failed", record, now)

    def _write_tick(self, state: QueueState, name: str, record: TickRecord, tick: Tick) -> None:
        """The tick as a message due at its time, and the cursor moved to it (schedule.lua's
        write_tick): an id still held by a message is not written over."""
        message_id = tick_id(name, tick.at_ms)
        if message_id not in state.payloads and message_id not in state.metas:
            head = state.pending.head()
            state.pending.add(message_id, tick.at_ms)
            state.payloads[message_id] = tick.payload
            state.metas[message_id] = Meta(0, 0, tick.budget, tick.at_ms)
            if head is None or tick.at_ms < head[1]:
                self._wake(tick.at_ms)
        if record.tick > 0:
            record.previous = record.tick
        record.cursor = record.tick = tick.at_ms
