"""Small helpers shared by the tests."""

import time
from collections.abc import Callable
from typing import Any

from delayqueue_django.queue import Queue


def wait_for(condition: Callable[[], Any], *, timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until ``condition()`` is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def fetch_when_due(queue: Queue, count: int | None = None, timeout: float = 5.0) -> list[Any]:
    """Fetch until something is handed out (the message's delay has to pass first)."""
    return list(wait_for(lambda: queue.fetch(count).messages, timeout=timeout, what="a delivery"))


def states_of(queue: Queue, message_id: str) -> list[str]:
    """Every structure holding the id: a healthy message is in exactly one."""
    client: Any = queue.store.client
    keys = queue.store.keys
    found = []
    for state in ("pending", "unack", "garbage"):
        if client.zscore(keys.key(state), message_id) is not None:
            found.append(state)
    for state in ("ready", "retry"):
        found += [state] * client.lrange(keys.key(state), 0, -1).count(message_id.encode())
    return found


def redis_time_ms(queue: Queue) -> int:
    seconds, micros = queue.store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000
