"""What ``Queue.schedules`` offers, told in the core, which cannot import the schedules wing
that provides it (``schedules.api.Schedules``, plugged in through core/features.py).

``QueueSchedules`` is the run-time API of one queue's schedules, and ``ScheduleInfo`` what
its calls return; ``ScheduleDefinition`` is what a ``ScheduleInfo`` tells of a schedule's
definition (the wing's ``schedules.definition.Schedule``). mypy checks that the wing's
classes have all of it: plugging ``Schedules`` in is typed by ``QueueSchedules``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol


class ScheduleDefinition(Protocol):
    """A schedule's definition, checked (the options of SCHEDULES; times in ms)."""

    @property
    def name(self) -> str: ...

    @property
    def cron(self) -> str | None: ...

    @property
    def every_ms(self) -> int | None: ...

    @property
    def time_zone(self) -> str:
        """The cron expression's time zone ("UTC" for an EVERY schedule)."""

    @property
    def payload(self) -> str:
        """A tick's payload, as JSON text ("" for a TASK schedule: its ticks are task calls)."""

    @property
    def missed(self) -> str: ...

    @property
    def missed_after_ms(self) -> int: ...

    @property
    def missed_limit(self) -> int: ...

    @property
    def task(self) -> str | None: ...

    @property
    def args(self) -> Sequence[Any]: ...

    @property
    def kwargs(self) -> Mapping[str, Any]: ...

    @property
    def source(self) -> str:
        """Where it was declared: "settings" (SCHEDULES) or "api" (added at run time)."""

    @property
    def fingerprint(self) -> str:
        """A digest of what decides its ticks and what they carry (its source left out)."""

    def describe(self) -> str:
        """How it fires, in a few words ("cron 0 8 * * MON (Europe/Berlin)", "every 30 s")."""


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule and where it stands (times on the store's clock, UTC)."""

    name: str
    # None when its stored definition cannot be read (see unreadable).
    schedule: ScheduleDefinition | None
    paused: bool
    # The next tick to fire (None while paused), its message's id once it is written, and
    # the last tick that fell due (None if none did since it was defined).
    next_run: datetime | None
    next_id: str | None
    last_run: datetime | None
    # Why a worker cannot write its ticks (its task's queue has no Tasks backend, say), and
    # since when; None while it fires. Cleared once a tick of it is written, or it is changed.
    failure: str | None = None
    failing_since: datetime | None = None
    # Why its stored definition cannot be read (written by hand or by another program),
    # None when it can. Such a schedule fires nothing: remove it, and add it again.
    unreadable: str | None = None

    @property
    def source(self) -> str | None:
        """ "settings" (declared in SCHEDULES) or "api" (added at run time); None when its
        definition cannot be read."""
        return None if self.schedule is None else self.schedule.source


class QueueSchedules(Protocol):
    """The run-time API of one queue's schedules: see ``delayqueue_django.Schedules``, the
    class that has it, for what each call does and raises."""

    def all(self) -> list[ScheduleInfo]:
        """Every schedule of the queue, by name."""

    def get(self, name: str) -> ScheduleInfo:
        """One schedule; UnknownSchedule if the queue has none of that name."""

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
        """A new schedule, its first tick written at once."""

    def change(self, name: str, **changes: Any) -> ScheduleInfo:
        """A schedule added at run time, with the keywords of ``add`` given replaced."""

    def pause(self, name: str) -> ScheduleInfo:
        """Fire nothing until resumed."""

    def resume(self, name: str) -> ScheduleInfo:
        """Fire again, from the next tick after now."""

    def remove(self, name: str) -> bool:
        """Remove a schedule; False if there was none."""
