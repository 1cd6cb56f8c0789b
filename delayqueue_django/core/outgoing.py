"""A message to send in bulk, each with its own timing."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message for ``Queue.send_many`` with its own delay, due time or retry count."""

    payload: Any
    delay: float | timedelta | None = None
    at: datetime | None = None
    retry_count: int | None = None
