"""The handlers of the chaos workers, a sync one and an ``async def`` one doing the same:
record the delivery in the ledger, and may work a while (``{"work_ms": n}`` in the payload)
so that kills land in the middle of handlers too, or refuse the message for good
(``{"reject": true}``: a dead letter whose exhaustion is owed)."""

import asyncio
import time

from delayqueue_django.core.message import Message
from delayqueue_django.exceptions import Reject
from tests.chaos import ledger


def handle(message: Message) -> None:
    work_ms = _begin(message)
    if work_ms:
        time.sleep(work_ms / 1000)
    ledger.record("done", message.id, message.attempt)


async def ahandle(message: Message) -> None:
    # The ledger's writes take microseconds: no need to take them off the event loop.
    work_ms = _begin(message)
    if work_ms:
        await asyncio.sleep(work_ms / 1000)
    ledger.record("done", message.id, message.attempt)


def _begin(message: Message) -> float:
    """Record the start, refuse the message if its payload says so; the ms to work."""
    ledger.record("start", message.id, message.attempt)
    payload = message.payload
    if isinstance(payload, dict) and payload.get("reject"):
        ledger.record("rejected", message.id, message.attempt)
        raise Reject("rejected on purpose")
    work_ms: float = payload.get("work_ms", 0) if isinstance(payload, dict) else 0
    return work_ms
