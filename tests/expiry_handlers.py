"""The handler and receivers of the expiry and postpone worker tests (DQ_TEST_HANDLER
"tests.expiry_handlers.handle"), recording to the same log as tests.worker_handlers.

The payload says what to do: ``{"do": "ok"}``; ``{"do": "postpone-times", "times": n}``
postpones (10 ms) the first n times it runs, then succeeds; ``{"do": "postpone"}`` always postpones;
``{"do": "retry", "seconds": s}`` raises Retry(s).
"""

import os
import time
from typing import Any

from django.dispatch import receiver

from delayqueue_django import Postpone, Retry, signals
from delayqueue_django.core.message import Message
from tests.worker_handlers import read_log, record


def handle(message: Message) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    action = payload.get("do", "ok")
    record(message.queue, "start", id=message.id, attempt=message.attempt, at=time.time())
    if action == "postpone-times":
        runs = [
            e for e in read_log(message.queue) if e["event"] == "start" and e["id"] == message.id
        ]
        if len(runs) <= payload["times"]:
            raise Postpone(0.01)
    if action == "postpone":
        raise Postpone(0)
    if action == "retry":
        raise Retry(payload["seconds"])
    record(message.queue, "done", id=message.id, attempt=message.attempt)


@receiver(signals.message_expired)
def on_expired(*, queue: str, message: Any, **kwargs: Any) -> None:
    record(queue, "expired", id=message.id, payload=message.payload, reason=message.reason)
    if os.environ.get("DQ_TEST_DIE_ON_EXPIRED") == "1":
        os._exit(9)  # a worker dying between the burial and confirming the announcement


@receiver(signals.message_exhausted)
def on_exhausted_with_reason(*, queue: str, message: Any, **kwargs: Any) -> None:
    record(queue, "dead", id=message.id, reason=message.reason)
