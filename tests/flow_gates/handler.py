"""The flow gates' handler: records, for every delivery, when the fetch handed it out (on
the Redis clock: its deadline less MAX_CONSUME_DURATION) and when the handler ran (this
host's clock, the same for every worker of a test), in the ledger folder the fleet names."""

import os
import time
from pathlib import Path

from delayqueue_django.core.message import Message
from tests.chaos.ledger import LEDGER_ENV
from tests.flow_gates.scenario import CONSUME_MS, HANDLER_SECONDS
from tests.keys_race import journal


def handle(message: Message) -> None:
    started = time.time()
    time.sleep(HANDLER_SECONDS)
    journal.write(
        Path(os.environ[LEDGER_ENV]),
        {
            "id": message.id,
            "handed_out_ms": message.deadline_ms - CONSUME_MS,
            "started": started,
            "ended": time.time(),
        },
    )


def hold(message: Message) -> None:
    """Runs until the worker is killed: its deliveries hold their slots of a cap."""
    time.sleep(600)
