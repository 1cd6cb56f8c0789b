"""Handlers and receivers used by the worker tests, in-process and in subprocesses.

Each call is recorded as JSON in the Redis list ``test:log`` on the queue's server, so a test
can see what every worker process did; for a memory queue, whose worker runs in the test's
own process, in ``MEMORY_LOG``. The payload says what to do:
``{"do": "ok" | "false" | "raise" | "reject" | "sleep" | "sleep-first" | "block" | "grow",
"seconds": float}`` ("sleep-first" sleeps on the first attempt only; "block" waits until a test
sets ``UNBLOCK``, or ``seconds`` pass; "grow" keeps ``mb`` more MB for the process's life);
with ``"count_unack": true`` the start record also holds the queue's unack count.
"""

import json
import os
import threading
import time
from typing import Any

from django.dispatch import receiver

from delayqueue_django import get_queue, handler, signals
from delayqueue_django.core.message import Message
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.exceptions import Reject

LOG_KEY = "test:log"
MEMORY_LOG: list[str] = []
# Holds every "block" handler of this process until set.
UNBLOCK = threading.Event()
# What "grow" handlers keep: a leak, for the --max-memory tests.
KEPT: list[bytes] = []


def record(queue: str, event: str, **fields: Any) -> None:
    entry = json.dumps({"event": event, "pid": os.getpid(), **fields})
    client = _redis_client(queue)
    if client is not None:
        client.rpush(LOG_KEY, entry)
    else:
        MEMORY_LOG.append(entry)


def _redis_client(queue: str) -> Any:
    """The queue's Redis client, or None for a memory queue."""
    store = parts(get_queue(queue).store)["0"]
    return store.client if isinstance(store, RedisStore) else None


def handle(message: Message) -> Any:
    payload = message.payload if isinstance(message.payload, dict) else {}
    action = payload.get("do", "ok")
    # "count_unack": also note how many deliveries are in flight as this one starts.
    seen = (
        {"unack": get_queue(message.queue).stats()["unack"]} if payload.get("count_unack") else {}
    )
    record(message.queue, "start", id=message.id, attempt=message.attempt, at=time.time(), **seen)
    if action == "sleep" or (action == "sleep-first" and message.attempt == 1):
        time.sleep(message.payload.get("seconds", 1.0))
    if action == "grow":
        KEPT.append(os.urandom(int(payload.get("mb", 1) * 2**20)))
    if action == "block":
        UNBLOCK.wait(timeout=message.payload.get("seconds", 60.0))
    if action == "false":
        return False
    if action == "raise" or (action == "sleep-first" and payload.get("then") == "raise"):
        raise RuntimeError("handler failed on purpose")
    if action == "reject":
        raise Reject("never going to work")
    record(message.queue, "done", id=message.id, attempt=message.attempt)
    return None


@handler("decorated")
def decorated(message: Message) -> None:
    record(message.queue, "decorated", id=message.id)


@receiver(signals.message_acked)
def exit_from_a_receiver(**kwargs: Any) -> None:
    """Connected before on_acked: a receiver raising SystemExit must neither stop the worker
    nor keep the receivers after it from being called."""
    if os.environ.get("DQ_TEST_RECEIVER_EXITS") == "1":
        raise SystemExit(3)


@receiver(signals.message_acked)
def on_acked(*, queue: str, message: Message, **kwargs: Any) -> None:
    still_there = get_queue(queue).peek(message.id) is not None
    record(queue, "acked", id=message.id, still_in_redis=still_there)


@receiver(signals.message_nacked)
def on_nacked(*, queue: str, message: Message, error: Any, retry_at_ms: Any, **kwargs: Any) -> None:
    record(queue, "nacked", id=message.id, error=repr(error), retry_at_ms=retry_at_ms)


@receiver(signals.message_exhausted)
def on_exhausted(*, queue: str, message: Any, **kwargs: Any) -> None:
    record(queue, "exhausted", id=message.id, payload=message.payload, attempt=message.attempt)
    if os.environ.get("DQ_TEST_DIE_ON_EXHAUSTED") == "1":
        os._exit(9)  # a worker dying between the burial and confirming the announcement


def read_log(queue: str = "default") -> list[dict[str, Any]]:
    client = _redis_client(queue)
    if client is not None:
        entries: list[Any] = client.lrange(LOG_KEY, 0, -1)
    else:
        entries = list(MEMORY_LOG)
    return [json.loads(entry) for entry in entries]
