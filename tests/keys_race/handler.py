"""The race's handler: records every delivery (id, key, generation, attempt, and which send
wrote the content it got) in the ledger folder the worker fleet names."""

import os
from pathlib import Path

from delayqueue_django.core.message import Message
from tests.chaos.ledger import LEDGER_ENV
from tests.keys_race import journal


def handle(message: Message) -> None:
    journal.write(
        Path(os.environ[LEDGER_ENV]),
        {
            "id": message.id,
            "key": message.key,
            "generation": message.generation,
            "attempt": message.attempt,
            "send": message.payload["send"],
        },
    )
