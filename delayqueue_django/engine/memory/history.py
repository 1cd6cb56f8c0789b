"""Attempt records on a memory queue's state, as nack.lua and fetch.lua write them (see
"Attempt records" in _prelude.lua and engine.history)."""

from typing import Any

from delayqueue_django.engine.history import appended
from delayqueue_django.engine.memory.server import QueueState


def record_attempt(state: QueueState, message_id: str, record: list[Any], bound: int) -> None:
    """Add a record to the message's, keeping the newest ``bound`` (0: none written)."""
    if bound > 0:
        state.history[message_id] = appended(state.history.get(message_id), record, bound)
