"""Liveness windows that follow the pace a scenario measures, not fixed seconds.

After its faults, a scenario waits for a backlog to empty (outbox rows, messages in the
queue). How long that takes depends on the backlog's size (``--chaos-messages``) and on the
machine (a loaded one relays and handles several times more slowly): a fixed window is either
too tight at full size in a slow hour or too loose to mean anything. So the wait first
measures how fast the backlog falls, then allows ``MARGIN`` times what the rest needs at that
pace, and never less than the scenario's floor. A backlog that stops falling still fails: at
the floor, or once it fell short of what its own pace promised.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from delayqueue_django.core.queue import Queue
from tests.chaos.accounting import WAITING_STATES

# How long the pace is measured before the window is set from it.
SAMPLE_SECONDS = 5.0
# The window: this many times what the rest of the backlog needs at the measured pace.
MARGIN = 3.0


@dataclass(frozen=True)
class Pace:
    """How a backlog emptied: its size when the wait began, the pace measured first (per
    second), the window set from it and the seconds it took."""

    backlog: int
    rate: float
    window: float
    seconds: float

    def __str__(self) -> str:
        if not self.backlog:
            return "none"
        return f"{self.backlog} in {self.seconds:.1f} s (measured {self.rate:.0f}/s)"


def window(remaining: int, rate: float, floor: float) -> float:
    """Seconds allowed for ``remaining`` items at ``rate`` a second: ``MARGIN`` times what
    that pace needs, at least ``floor`` (all of it when nothing moved while measuring)."""
    if rate <= 0:
        return floor
    return max(floor, MARGIN * remaining / rate)


def wait_until_empty(count: Callable[[], int | None], what: str, floor: float) -> Pace:
    """Until ``count()`` is 0 (``None``: unknown for now, e.g. Redis coming back). Measures
    the pace over ``SAMPLE_SECONDS`` (or until empty), then waits at most the window that pace
    sets, counted from the start; raises AssertionError naming ``what`` when it runs out."""
    started = time.monotonic()
    backlog = last = _first_count(count)
    rate: float | None = None
    limit = floor
    while last != 0:
        elapsed = time.monotonic() - started
        if rate is None and elapsed >= SAMPLE_SECONDS:
            rate = (backlog - last) / elapsed
            limit = window(last, rate, floor) + elapsed
        if elapsed > limit:
            measured = "nothing measured" if rate is None else f"measured {rate:.1f}/s"
            raise AssertionError(
                f"{last} {what} left after {elapsed:.0f} s ({backlog} at the start; "
                f"{measured}; window {limit:.0f} s, floor {floor:.0f} s)"
            )
        time.sleep(0.1)
        now = count()
        last = last if now is None else now
    seconds = time.monotonic() - started
    if rate is None:  # emptied while the pace was being measured
        rate = backlog / seconds if seconds else float(backlog)
    return Pace(backlog, rate, window(backlog, rate, floor), seconds)


def _first_count(count: Callable[[], int | None]) -> int:
    deadline = time.monotonic() + SAMPLE_SECONDS
    while (first := count()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no count within {SAMPLE_SECONDS} s")
        time.sleep(0.1)
    return first


def waiting_messages(queue: Queue) -> Callable[[], int | None]:
    """A count of what still waits in ``queue`` (pending, ready, in flight, to retry);
    ``None`` while its Redis does not answer."""

    def count() -> int | None:
        try:
            stats = queue.stats()
        except RedisError:
            return None
        return sum(stats[state] for state in WAITING_STATES)

    return count
