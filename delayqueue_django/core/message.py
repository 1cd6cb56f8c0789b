"""What a consumer receives: one delivery of one message, with its decoded payload."""

from dataclasses import dataclass, field
from typing import Any

from delayqueue_django.core import time_limits
from delayqueue_django.exceptions import TimeLimitExceeded


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
    group: str | None = None
    """The ordered group it was sent with (``send(group=...)``), or None."""
    tracked: bool = field(default=True, repr=False, compare=False)
    """Whether the queue had expiries, postpone counts or ordered groups when this was
    fetched, so that its ack must clean them up (see Queue.ack); True when not known."""

    def time_left(self) -> float | None:
        """Seconds the handler may still run under the queue's TIME_LIMIT (0 once past it),
        or None when the queue has no TIME_LIMIT (or the message is not being handled)."""
        return time_limits.time_left(self)

    def check_time_limit(self) -> None:
        """Raise ``TimeLimitExceeded`` if the handler ran past the queue's TIME_LIMIT: call
        it between steps of a long handler. With handler threads (``--concurrency`` above
        1) this check is the only stop there is: a thread cannot be ended from outside."""
        if self.time_left() == 0:
            raise TimeLimitExceeded(
                f"time limit: message id={self.id} queue={self.queue} ran past TIME_LIMIT"
            )

    @property
    def retries_left(self) -> int:
        """Retries still left after this delivery."""
        return max(self.retry_count - (self.attempt - 1), 0)

    @property
    def is_last_attempt(self) -> bool:
        """No retry follows if this delivery fails."""
        return self.attempt > self.retry_count
