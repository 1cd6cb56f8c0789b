"""The handler of the chaos workers: records the delivery in the ledger, and may work a while
(``{"work_ms": n}`` in the payload) so that kills land in the middle of handlers too, or
refuse the message for good (``{"reject": true}``: a dead letter whose exhaustion is owed)."""

import time

from delayqueue_django.core.message import Message
from delayqueue_django.exceptions import Reject
from tests.chaos import ledger


def handle(message: Message) -> None:
    ledger.record("start", message.id, message.attempt)
    payload = message.payload
    if isinstance(payload, dict) and payload.get("reject"):
        ledger.record("rejected", message.id, message.attempt)
        raise Reject("rejected on purpose")
    work_ms = payload.get("work_ms", 0) if isinstance(payload, dict) else 0
    if work_ms:
        time.sleep(work_ms / 1000)
    ledger.record("done", message.id, message.attempt)
