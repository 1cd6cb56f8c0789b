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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delayqueue_django.core.message import Message

# Each running delivery's end (time.monotonic()), by (queue, id, lease): a Message is a
# frozen value, so what it needs to answer time_left() lives here while its handler runs.
_ends: dict[tuple[str, str, int], float] = {}
_lock = threading.Lock()


@contextmanager
def running(message: "Message", limit: float | None) -> Iterator[None]:
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


def time_left(message: "Message") -> float | None:
    """Seconds its handler may still run (0 once past the limit), or None: no TIME_LIMIT,
    or not running under a worker."""
    with _lock:
        end = _ends.get((message.queue, message.id, message.lease))
    return None if end is None else max(end - time.monotonic(), 0.0)
