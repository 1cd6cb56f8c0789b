"""TIME_LIMIT as a handler sees it: how long its delivery may still run
(``Message.time_left()``), and the soft check that raises ``TimeLimitExceeded``
(``Message.check_time_limit()``).

Where handler threads share a process, nothing can stop one of them from outside: Python
has no safe way to end a thread. The handler is told its time and checks it between steps;
the worker logs and counts one that overran. (A worker process running one handler at a
time is killed by its supervisor instead: see worker.time_limits.)
"""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from delayqueue_django.exceptions import TimeLimitExceeded


class Delivered(Protocol):
    """What names a running delivery: a Message (typed by what it has, so that this module
    and core.message, which calls it, do not import each other)."""

    @property
    def queue(self) -> str: ...

    @property
    def id(self) -> str: ...

    @property
    def lease(self) -> int: ...


# Each running delivery's end (time.monotonic()), by (queue, id, lease): a Message is a
# frozen value, so what it needs to answer time_left() lives here while its handler runs.
_ends: dict[tuple[str, str, int], float] = {}
_lock = threading.Lock()


@contextmanager
def running(message: Delivered, limit: float | None) -> Iterator[None]:
    """The handler of ``message`` runs in this block, with ``limit`` seconds (None: none)."""
    if limit is None:
        yield
        return
    key = (message.queue, message.id, message.lease)
    with _lock:
        _ends[key] = time.monotonic() + limit
    try:
        yield
    finally:
        with _lock:
            _ends.pop(key, None)


def time_left(message: Delivered) -> float | None:
    """Seconds its handler may still run (0 once past the limit), or None: no TIME_LIMIT,
    or not running under a worker."""
    with _lock:
        end = _ends.get((message.queue, message.id, message.lease))
    return None if end is None else max(end - time.monotonic(), 0.0)


def cancelled_at(limit: float) -> TimeLimitExceeded:
    """What an async handler cancelled at its TIME_LIMIT failed of (worker.async_handling;
    the Tasks runner records it for an async task)."""
    return TimeLimitExceeded(
        f"time limit: the handler ran past TIME_LIMIT ({limit:g} s) and was cancelled"
    )
