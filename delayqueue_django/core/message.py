"""What a consumer receives: one delivery of one message, with its decoded payload."""

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery of one message, as a handler receives it."""

    id: str
    """The message id ``send`` returned."""
    queue: str
    """The queue's name, as in DELAYQUEUES."""
    payload: Any
    """The payload, decoded from JSON."""
    attempt: int
    """1 on the first delivery, 2 on the first retry, and so on."""
    retry_count: int
    """Retries allowed after the first delivery."""
    lease: int
    """The delivery's token: acks and nacks carrying an older lease are ignored."""
    deadline_ms: int
    """When this delivery is redelivered if not acked (ms since the epoch, Redis's clock)."""
    due_ms: int
    """When the message became due for this delivery: its due time, retry time or the
    moment it was requeued (ms since the epoch, Redis's clock; 0 if not known)."""
    traceparent: str = ""
    """The W3C trace context of the span that sent it, when that send was traced (see
    docs/guides/tracing.md); empty otherwise."""
    key: str | None = None
    """The key it was sent with (``send(key=...)``), or None."""
    generation: int = 0
    """Which content of a keyed message this is: the queue's clock (ms) when it was sent or
    last replaced, so a replaced message tells its new content from the old; 0 unkeyed."""

    tracked: bool = field(default=True, repr=False, compare=False)
    """Whether the queue had expiries or postpone counts when this was fetched, so that its
    ack must clean them up (see Queue.ack); True when not known."""

    @property
    def retries_left(self) -> int:
        """Retries still left after this delivery."""
        return max(self.retry_count - (self.attempt - 1), 0)

    @property
    def is_last_attempt(self) -> bool:
        """No retry follows if this delivery fails."""
        return self.attempt > self.retry_count
