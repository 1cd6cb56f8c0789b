"""What every part of a ``ScheduleRunner`` stands on: the queue, this worker's view of its
schedules (``Known``, and ``Failing`` for those it could not handle), the ticks built
from them (``tick_payload``, which the run-time API uses too), and which missed ticks
are too old to run, which both writing and judging ticks ask."""

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone

from delayqueue_django.core import features
from delayqueue_django.core.encoding import encode_payload
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import ScheduleRecord, Tick
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import RecentTicks, Schedule

logger = logging.getLogger("delayqueue_django.schedules")


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


class RunnerState:
    """A runner's queue, lock and view of the schedules, and the ticks it builds."""

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

    def _seen(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)

    def _first_tick(self, schedule: Schedule, now: int) -> Tick | None:
        at = schedule.next_after(now)
        return None if at is None else self._tick(schedule, at)

    def _tick(self, schedule: Schedule, at: int) -> Tick:
        payload = tick_payload(schedule, self.queue.name, at, self._now_ms)
        return Tick(at, self.queue.config.retry_count, payload)

    def _earliest_to_run(self, schedule: Schedule, now: int) -> int | None:
        """The earliest of the latest ``missed_runs`` ticks due by ``now``: of a run of
        missed ticks, it and those after it run; None if no tick is due."""
        with self._lock:
            recent = self._recent.get(schedule.name)
            if recent is None or recent.schedule != schedule:
                recent = self._recent[schedule.name] = RecentTicks(schedule, schedule.missed_runs)
            return recent.earliest(now)


def _known_of(record: ScheduleRecord, schedule: Schedule) -> Known:
    """A schedule as its record in the store stands, its definition read."""
    if record.fingerprint is None:
        # Its tick record is missing, or unreadable as schedule.lua reads it.
        return Known(schedule, schedule.fingerprint, False, 0, 0, True)
    return Known(schedule, record.fingerprint, record.paused, record.cursor_ms, record.tick_ms)


def _source(record: ScheduleRecord) -> str | None:
    try:
        return Schedule.from_json(record.name, record.definition or "").source
    except InvalidSchedule:
        return None
