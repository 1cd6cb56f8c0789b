"""The race's handler: records every delivery (id, key, generation, attempt, which send
wrote the content it got, and whether it succeeded) in the ledger folder the worker fleet
names. A first delivery of a payload marked ``fail`` fails, so that messages go back to
wait for their retry, or are superseded on the way when a newer one with their key waits."""

import os
from pathlib import Path

from delayqueue_django.core.message import Message
from tests.chaos.ledger import LEDGER_ENV
from tests.keys_race import journal


def handle(message: Message) -> None:
    fails = bool(message.payload.get("fail")) and message.attempt == 1
    journal.write(
        Path(os.environ[LEDGER_ENV]),
        {
            "id": message.id,
            "key": message.key,
            "generation": message.generation,
            "attempt": message.attempt,
            "send": message.payload["send"],
            "done": not fails,
        },
    )
    if fails:
        raise RuntimeError("the race's first delivery of a message marked fail")
