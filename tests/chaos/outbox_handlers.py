"""Handlers of the outbox and exactly-once chaos scenarios (tests/chaos/test_outbox.py)."""

import os
import time

from delayqueue_django.core.message import Message
from tests.chaos import ledger
from tests.task_app.models import Effect


def write_effect(message: Message) -> None:
    """An EXACTLY_ONCE queue's handler: writes one row in the handler's transaction (with
    the record of the message), after working a while (``{"work_ms": n}``) so that kills
    land inside transactions too. The ledger counts deliveries; the rows, effects."""
    ledger.record("start", message.id, message.attempt)
    work_ms = message.payload.get("work_ms", 0) if isinstance(message.payload, dict) else 0
    Effect.objects.create(message_id=message.id, pid=os.getpid())
    if work_ms:
        time.sleep(work_ms / 1000)
    ledger.record("done", message.id, message.attempt)
