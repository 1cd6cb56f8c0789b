"""The ordered groups' worker handler: records when each delivery starts and ends (wall
clock, shared by the worker processes of one machine) in the ledger folder the worker fleet
names, one JSON line per event (tests/keys_race/journal.py). A payload may ask to fail its
first delivery (``fail``), every delivery (``always_fail``), or to hang on its first one
(``hang``: the worker is killed meanwhile)."""

import os
import time
from pathlib import Path

from delayqueue_django.core.message import Message
from tests.chaos.ledger import LEDGER_ENV
from tests.keys_race import journal

HANG_SECONDS = 60


def handle(message: Message) -> None:
    payload = message.payload
    folder = Path(os.environ[LEDGER_ENV])
    event = {"id": message.id, "group": payload["group"], "seq": payload["seq"]}
    event.update(attempt=message.attempt, pid=os.getpid())
    journal.write(folder, {**event, "event": "start", "at": time.time()})
    if payload.get("hang") and message.attempt == 1:
        time.sleep(HANG_SECONDS)
    time.sleep(payload.get("sleep", 0.02))
    fails = payload.get("always_fail") or (payload.get("fail") and message.attempt == 1)
    journal.write(folder, {**event, "event": "end", "at": time.time(), "done": not fails})
    if fails:
        raise RuntimeError("a grouped message asked to fail")
