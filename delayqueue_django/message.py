"""What a consumer receives: one delivery of one message, with its decoded payload."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    # The queue's name, as in DELAYQUEUES.
    queue: str
    payload: Any
    # 1 on the first delivery, 2 on the first retry, and so on.
    attempt: int
    # Retries allowed after the first delivery.
    retry_count: int
    # The delivery's token: acks and nacks carrying an older lease are ignored.
    lease: int
    # When this delivery is redelivered if not acked (ms since the epoch, Redis's clock).
    deadline_ms: int
    # When the message became due for this delivery: its due time, retry time or the
    # moment it was requeued (ms since the epoch, Redis's clock; 0 if not known).
    due_ms: int

    @property
    def retries_left(self) -> int:
        return max(self.retry_count - (self.attempt - 1), 0)

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt > self.retry_count
