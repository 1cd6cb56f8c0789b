"""Judging a tick as it is handed out: whether the worker runs it, or acks it unrun
(``declines``); a tick of a schedule this worker did not know teaches it. Apart from
writing: it runs in the handler threads, one read of the store per tick."""

import logging

from delayqueue_django.core.message import Message
from delayqueue_django.engine.records import ScheduleRecord, loggable, parse_tick_id
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner.state import RunnerState, _known_of, _moment

logger = logging.getLogger("delayqueue_django.schedules")


class RunnerJudging(RunnerState):
    """Whether a tick handed out runs."""

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
