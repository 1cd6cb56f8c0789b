"""What a schedule is: its definition, checked, and the times of its ticks.

A schedule fires on a cron expression (``cronsim``, in a time zone) or every so many seconds
(at whole multiples of the interval since the Unix epoch). Its identity is its name; its
fingerprint, a digest of everything that decides its ticks and what they carry, tells when
a definition changed (see ``engine/lua/schedule.lua``).
"""

import hashlib
import json
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from delayqueue_django.core.encoding import encode_payload
from delayqueue_django.exceptions import InvalidSchedule, PayloadEncodingError, PayloadTooLarge

MISSED_POLICIES = ("skip", "once", "all")
DEFAULT_MISSED = "once"
DEFAULT_MISSED_AFTER_MS = 60_000
# Under MISSED "all", how many of a run of missed ticks run at most (the latest ones): a
# catch-up after a long outage is bounded, however short the interval.
DEFAULT_MISSED_LIMIT = 100
LARGEST_MISSED_LIMIT = 10_000
# Ticks closer together than this are not what a delay queue's schedules are for.
SHORTEST_EVERY_MS = 1000
# Ticks further apart than this are not either, and their times would soon pass the year
# 9999, which no datetime holds (the API's next_run, a task's run_after): the bound a cron
# expression has too (cronsim looks 50 years ahead).
LONGEST_EVERY_MS = 50 * 365 * 86_400_000

OPTIONS = (
    "CRON",
    "EVERY",
    "PAYLOAD",
    "TIME_ZONE",
    "MISSED",
    "MISSED_AFTER",
    "MISSED_LIMIT",
    "TASK",
    "ARGS",
    "KWARGS",
)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
DOTTED_PATH_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")

SETTINGS = "settings"
API = "api"


@dataclass(frozen=True)
class Schedule:
    """A schedule's definition, checked; times are ms since the epoch."""

    name: str
    cron: str | None
    every_ms: int | None
    # The cron expression's time zone ("UTC" for an EVERY schedule).
    time_zone: str
    # A tick's payload, as JSON text ("" for a TASK schedule, whose ticks are task calls).
    payload: str
    missed: str = DEFAULT_MISSED
    missed_after_ms: int = DEFAULT_MISSED_AFTER_MS
    # MISSED "all" runs at most this many of a run of missed ticks: the latest ones.
    missed_limit: int = DEFAULT_MISSED_LIMIT
    task: str | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Where it was declared: settings (synced by workers as they start) or the run-time API.
    source: str = SETTINGS

    def as_dict(self) -> dict[str, Any]:
        """Everything but the name, as JSON carries it."""
        return {
            "cron": self.cron,
            "every_ms": self.every_ms,
            "time_zone": self.time_zone,
            "payload": self.payload,
            "missed": self.missed,
            "missed_after_ms": self.missed_after_ms,
            "missed_limit": self.missed_limit,
            "task": self.task,
            "args": self.args,
            "kwargs": self.kwargs,
            "source": self.source,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, text: str) -> "Schedule":
        """A definition as stored; InvalidSchedule if it is not one (a foreign write)."""
        try:
            data = json.loads(text)
            schedule = cls(
                name=name,
                cron=data["cron"],
                every_ms=data["every_ms"],
                time_zone=data["time_zone"],
                payload=data["payload"],
                missed=data["missed"],
                missed_after_ms=data["missed_after_ms"],
                # Stored before MISSED_LIMIT existed: the default, which it now has.
                missed_limit=data.get("missed_limit", DEFAULT_MISSED_LIMIT),
                task=data["task"],
                args=data["args"],
                kwargs=data["kwargs"],
                source=data["source"],
            )
            schedule.check()
        # RecursionError: JSON nested deeper than the parser goes.
        except (ValueError, TypeError, KeyError, RecursionError) as error:
            raise InvalidSchedule(
                f"schedule {name!r} has an unreadable definition: {error}"
            ) from None
        return schedule

    def check(self) -> None:
        """Raise InvalidSchedule unless every field is usable (a stored definition)."""
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidSchedule("exactly one of cron and every_ms")
        if self.cron is not None:
            _cron_problem(self.cron, _zone(self.time_zone))
        elif not (
            isinstance(self.every_ms, int)
            and SHORTEST_EVERY_MS <= self.every_ms <= LONGEST_EVERY_MS
        ):
            raise InvalidSchedule(f"every_ms {self.every_ms!r}")
        if (
            self.missed not in MISSED_POLICIES
            or not isinstance(self.missed_after_ms, int)
            or _missed_limit(self.missed_limit) is None
        ):
            raise InvalidSchedule(
                f"missed {self.missed!r}, {self.missed_after_ms!r}, {self.missed_limit!r}"
            )
        if not isinstance(self.payload, str) or self.source not in (SETTINGS, API):
            raise InvalidSchedule("payload or source")
        # The admin and the ticks read these as they are; a definition written by hand may
        # hold anything there.
        expected = {"time_zone": str, "task": str | None, "args": list, "kwargs": dict}
        for field_name, kind in expected.items():
            value = getattr(self, field_name)
            if not isinstance(value, kind):
                raise InvalidSchedule(f"{field_name} is a {type(value).__name__}")

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the definition, its source left out: any change of what decides the
        ticks or what they carry changes it. A default MISSED_LIMIT is left out too, so that
        a definition stored before that option existed keeps its fingerprint (workers would
        otherwise take it for another definition and write none of its ticks)."""
        fields = {key: value for key, value in self.as_dict().items() if key != "source"}
        if self.missed_limit == DEFAULT_MISSED_LIMIT:
            del fields["missed_limit"]
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def missed_runs(self) -> int:
        """How many of a run of missed ticks run, the latest ones: none (``skip``), one
        (``once``) or up to MISSED_LIMIT (``all``)."""
        return {"skip": 0, "once": 1}.get(self.missed, self.missed_limit)

    def describe(self) -> str:
        """How it fires, in a few words."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.time_zone})"
        return f"every {_seconds(self.every_ms or 0)} s"

    # Tick times

    def next_after(self, ms: int) -> int | None:
        """The first tick strictly after ``ms``; None if the cron never fires again."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        return self._cron_after(ms)

    def latest_at_or_before(self, ms: int) -> int | None:
        """The last tick at or before ``ms``; None if there is none in the last 50 years."""
        if self.every_ms is not None:
            return ms // self.every_ms * self.every_ms
        try:
            candidate = next(CronSim(self._cron_text, _at(ms + 1, self._zone), reverse=True))
        except StopIteration:
            return None
        # Found backwards, then settled forwards: a DST change can move a backward step
        # onto a time the forward iteration (the one ticks follow) never yields.
        latest = None
        at = self._cron_after(_ms(candidate) - 1)
        while at is not None and at <= ms:
            latest, at = at, self._cron_after(at)
        return latest

    def count_ticks(self, first: int, before: int, at_most: int) -> int | None:
        """How many ticks there are from the tick ``first`` up to ``before`` (excluded). A
        cron expression's are counted tick by tick: None if more than ``at_most``."""
        if self.every_ms is not None:
            return max(0, -(-(before - first) // self.every_ms))
        count, at = 0, self._cron_after(first - 1)
        while at is not None and at < before:
            if count == at_most:
                return None
            count, at = count + 1, self._cron_after(at)
        return count

    @property
    def _cron_text(self) -> str:
        assert self.cron is not None
        return self.cron

    @cached_property
    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    def _cron_after(self, ms: int) -> int | None:
        iterator = CronSim(self._cron_text, _at(ms, self._zone))
        try:
            # cronsim counts a fixed-time cron on the wall clock (as Debian's cron does, see
            # docs/guides/schedules.md), so around a DST change it can yield a time at or
            # before the one it started from: the first later one is the tick.
            while (found := _ms(next(iterator))) <= ms:
                pass
        except StopIteration:
            return None
        return found


class RecentTicks:
    """The earliest of a schedule's ``count`` latest ticks at or before a moment, for a
    moment that moves on (the store's clock), mostly forwards: the ticks found are kept from
    one call to the next, so that a call costs a cron step per tick the moment moved over,
    not ``count`` of them (a cron step back costs about 0.15 ms)."""

    def __init__(self, schedule: Schedule, count: int) -> None:
        self.schedule = schedule
        self.count = count
        # The latest `count` ticks at or before the moment of the last call, oldest first
        # (fewer if the last 50 years hold fewer), and the first tick after them.
        self._ticks: deque[int] = deque()
        self._after: int | None = None

    def earliest(self, ms: int) -> int | None:
        """None if no tick is at or before ``ms`` (within 50 years, for a cron)."""
        schedule, ticks = self.schedule, self._ticks
        every = schedule.every_ms
        if every is not None:
            return (ms // every - self.count + 1) * every
        while ticks and ticks[-1] > ms:  # moved back
            self._after = ticks.pop()
        for _ in range(self.count):
            if not ticks or self._after is None or self._after > ms:
                break
            ticks.append(self._after)
            self._after = schedule.next_after(self._after)
        else:
            if self._after is not None and self._after <= ms:
                ticks.clear()  # moved on by more than `count` ticks: found afresh
        while len(ticks) > self.count:
            ticks.popleft()
        if not ticks:
            latest = schedule.latest_at_or_before(ms)
            if latest is None:
                return None
            ticks.append(latest)
            self._after = schedule.next_after(latest)
        while len(ticks) < self.count:
            before = schedule.latest_at_or_before(ticks[0] - 1)
            if before is None:
                break
            ticks.appendleft(before)
        return ticks[0]


def _at(ms: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(zone)


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}"


@dataclass(frozen=True)
class Subject:
    """Whose problem a message names: a schedule in settings, where options are named as
    there (``...['SCHEDULES']['nightly']['CRON']``), or one given to the run-time API,
    whose options are its keyword arguments (``cron=``)."""

    text: str
    api: bool = False

    def option(self, key: str) -> str:
        return f"{self.text}: {key.lower()}=" if self.api else f"{self.text}[{key!r}]"


def _zone(name: Any, subject: Subject = Subject("schedule")) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise InvalidSchedule(
            f"{subject.option('TIME_ZONE')} must be a time zone name, not {name!r}.", "E045"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"{subject.option('TIME_ZONE')} is {name!r}, which is not a time zone this "
            "system knows.",
            "E045",
        ) from None


def _cron_problem(cron: Any, zone: ZoneInfo, subject: Subject = Subject("schedule")) -> None:
    where = subject.option("CRON")
    if not isinstance(cron, str):
        raise InvalidSchedule(f"{where} must be a cron expression, not {cron!r}.", "E043")
    try:
        next(CronSim(cron, datetime.now(zone)))
    except CronSimError as error:
        raise InvalidSchedule(
            f"{where} is {cron!r}, which is not a valid cron expression: {error}.", "E043"
        ) from None
    except StopIteration:
        raise InvalidSchedule(
            f"{where} is {cron!r}, which never fires (no time matches it in the next 50 years).",
            "E043",
        ) from None


def _missed_limit(value: Any) -> int | None:
    """A MISSED_LIMIT as an int, or None if it is not a whole number in range."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= LARGEST_MISSED_LIMIT else None


def _duration_ms(value: Any) -> int | None:
    """Seconds (a number or a timedelta) as whole ms, or None if not a finite number."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    if value in (float("inf"), float("-inf")):
        return None
    return round(value * 1000)


def build(
    name: Any,
    options: Any,
    *,
    subject: Subject,
    queue: str,
    max_payload_bytes: int,
    default_time_zone: str,
    source: str,
) -> Schedule:
    """A schedule from its options (as in settings: CRON, EVERY, PAYLOAD, ...); raises
    InvalidSchedule, naming the system check that reports the same problem."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidSchedule(
            f"{subject.text} has an invalid name: a schedule's name is 1 to 100 letters, "
            "digits and _ . : -",
            "E040",
        )
    if not isinstance(options, Mapping):
        raise InvalidSchedule(
            f"{subject.text} must be a dict of options (CRON or EVERY, PAYLOAD, ...), "
            f"not {type(options).__name__}.",
            "E040",
        )
    unknown = sorted(str(key) for key in options if key not in OPTIONS)
    if unknown:
        raise InvalidSchedule(
            f"{subject.text} has unknown option(s) {', '.join(map(repr, unknown))}; "
            f"the options are {', '.join(OPTIONS)}.",
            "E041",
        )
    cron, every = options.get("CRON"), options.get("EVERY")
    if (cron is None) == (every is None):
        raise InvalidSchedule(
            f"{subject.text} must set exactly one of CRON (a cron expression) and EVERY "
            "(seconds or a timedelta).",
            "E042",
        )
    every_ms = None
    if cron is not None:
        zone_name = options.get("TIME_ZONE", default_time_zone)
        _cron_problem(cron, _zone(zone_name, subject), subject)
    else:
        if "TIME_ZONE" in options:
            raise InvalidSchedule(
                f"{subject.text} sets TIME_ZONE with EVERY; ticks every N seconds fall at "
                "multiples of N since the Unix epoch, whatever the zone. Use CRON for a "
                "time of day.",
                "E045",
            )
        zone_name = "UTC"
        every_ms = _duration_ms(every)
        if every_ms is None or not SHORTEST_EVERY_MS <= every_ms <= LONGEST_EVERY_MS:
            raise InvalidSchedule(
                f"{subject.option('EVERY')} must be at least one second and at most 50 years "
                f"(a number or a timedelta), not {every!r}.",
                "E044",
            )
    missed = options.get("MISSED", DEFAULT_MISSED)
    if missed not in MISSED_POLICIES:
        raise InvalidSchedule(
            f"{subject.option('MISSED')} must be one of "
            f"{', '.join(map(repr, MISSED_POLICIES))}, not {missed!r}.",
            "E046",
        )
    missed_after = options.get("MISSED_AFTER", DEFAULT_MISSED_AFTER_MS / 1000)
    missed_after_ms = _duration_ms(missed_after)
    if missed_after_ms is None or missed_after_ms < 0:
        raise InvalidSchedule(
            f"{subject.option('MISSED_AFTER')} must be seconds (a number or a timedelta, "
            f"zero or more), not {missed_after!r}.",
            "E046",
        )
    missed_limit = options.get("MISSED_LIMIT", DEFAULT_MISSED_LIMIT)
    if _missed_limit(missed_limit) is None:
        raise InvalidSchedule(
            f"{subject.option('MISSED_LIMIT')} must be a whole number from 1 to "
            f"{LARGEST_MISSED_LIMIT:,}, not {missed_limit!r}.",
            "E046",
        )
    if "MISSED_LIMIT" in options and missed != "all":
        raise InvalidSchedule(
            f"{subject.text} sets MISSED_LIMIT with MISSED {missed!r}; it bounds the missed "
            "ticks that MISSED 'all' runs ('once' runs one, 'skip' none).",
            "E046",
        )
    task, args, kwargs = _task_options(options, subject, queue, max_payload_bytes)
    payload = ""
    if task is None:
        try:
            payload = encode_payload(
                options.get("PAYLOAD"), max_bytes=max_payload_bytes, queue=queue
            )
        except (PayloadEncodingError, PayloadTooLarge) as error:
            raise InvalidSchedule(
                f"{subject.option('PAYLOAD')} cannot be sent: {error}.", "E047"
            ) from None
    return Schedule(
        name=name,
        cron=cron,
        every_ms=every_ms,
        time_zone=zone_name,
        payload=payload,
        missed=missed,
        missed_after_ms=missed_after_ms,
        missed_limit=missed_limit,
        task=task,
        args=args,
        kwargs=kwargs,
        source=source,
    )


def _task_options(
    options: Mapping[str, Any], subject: Subject, queue: str, max_payload_bytes: int
) -> tuple[str | None, list[Any], dict[str, Any]]:
    task, args, kwargs = options.get("TASK"), options.get("ARGS"), options.get("KWARGS")
    if task is None:
        if args is not None or kwargs is not None:
            raise InvalidSchedule(f"{subject.text} sets ARGS or KWARGS without TASK.", "E048")
        return None, [], {}
    if not isinstance(task, str) or not DOTTED_PATH_PATTERN.match(task):
        raise InvalidSchedule(
            f"{subject.option('TASK')} must be the dotted path of a task, like "
            f"'shop.tasks.report'; not {task!r}.",
            "E048",
        )
    if "PAYLOAD" in options:
        raise InvalidSchedule(
            f"{subject.text} sets both TASK and PAYLOAD; a task's tick carries its call "
            "(ARGS and KWARGS).",
            "E048",
        )
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise InvalidSchedule(
            f"{subject.option('ARGS')} must be a list and {subject.option('KWARGS')} a dict.",
            "E048",
        )
    try:
        # As JSON gives them back to the task: checked here, and the same in every tick.
        text = encode_payload([args, kwargs], max_bytes=max_payload_bytes, queue=queue)
    except (PayloadEncodingError, PayloadTooLarge) as error:
        raise InvalidSchedule(
            f"{subject.text}: ARGS and KWARGS cannot be sent: {error}.", "E047"
        ) from None
    decoded_args, decoded_kwargs = json.loads(text)
    return task, decoded_args, decoded_kwargs
