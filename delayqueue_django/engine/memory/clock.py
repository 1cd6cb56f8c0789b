"""The memory store's clock: what Redis's TIME is to the scripts.

``SystemClock`` reads this machine's clock; ``ManualClock`` moves only when told to, so tests
can send a message due in a month and deliver it a moment later.
"""

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""

    def now_us(self) -> int:
        """Microseconds since the epoch (Redis's TIME reads them too: sends count delays
        from them)."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def now_us(self) -> int:
        return time.time_ns() // 1_000


class ManualClock:
    """A clock that stands still until ``advance`` moves it forward."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = SystemClock().now_ms() if start_ms is None else start_ms
        self._lock = threading.Lock()
        self._listeners: list[Callable[[int], None]] = []

    def now_ms(self) -> int:
        return self._now

    def now_us(self) -> int:
        return self._now * 1000

    def advance(self, seconds: float | timedelta) -> int:
        """Move forward by ``seconds`` (never back), rounded up to the millisecond as due
        times are, so that a message sent with a delay is due after an advance by it;
        returns the new time in ms."""
        if isinstance(seconds, timedelta):
            micros = seconds // timedelta(microseconds=1)
        elif seconds >= 0:  # not NaN either
            micros = round(seconds * 1_000_000)
        else:
            micros = -1
        if micros < 0:
            unit = "" if isinstance(seconds, timedelta) else " s"
            raise ValueError(f"a clock only moves forward; cannot advance by {seconds!r}{unit}")
        with self._lock:
            self._now += -(-micros // 1000)
            now = self._now
        for listener in list(self._listeners):
            listener(now)
        return now

    def on_advance(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(now_ms)`` after every move (the memory server wakes its workers)."""
        self._listeners.append(listener)
