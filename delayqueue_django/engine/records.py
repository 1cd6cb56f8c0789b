"""Plain records passed in and out of the store, and the constants of its protocol."""

from dataclasses import dataclass

STATES = ("pending", "ready", "unack", "retry", "garbage")

# A nack with this delay buries the message at once, whatever its retry budget.
BURY = -1


@dataclass(frozen=True)
class StoreLimits:
    """Bounds that keep every script call short."""

    # How long a delivery may stay unacked before it is redelivered.
    consume_ms: int = 30_000
    # The most messages one fetch moves (expired + due) and the staging lists' length.
    stage_limit: int = 1000
    # Messages per send script call; a bulk send is cut into calls of this size.
    send_batch_size: int = 1000


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to schedule. Exactly one of ``at_ms`` and ``delay_ms`` applies."""

    id: str
    payload: str
    budget: int
    at_ms: int | None = None
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed out by fetch; ``lease`` is the token its ack or nack must carry."""

    id: str
    payload: str
    attempt: int
    lease: int
    budget: int
    deadline_ms: int
    # When the message became due for this delivery (0 if sent before this was kept).
    due_ms: int


@dataclass(frozen=True, slots=True)
class FetchResult:
    now_ms: int
    # When to fetch again: now_ms if work is waiting, None if the queue is empty.
    next_ms: int | None
    expired: int
    deliveries: list[Delivery]
    # An exhaustion is waiting to be announced (claim_exhausted would return it).
    exhaustions_owed: bool = False
    # Microseconds past now_ms on the store's clock (0-999), and when (time.monotonic())
    # that clock was read, as best this process can tell: workers time their wake-ups to
    # the due time with them, instead of up to a millisecond after.
    now_us: int = 0
    read_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NackOutcome:
    id: str
    exhausted: bool
    # The retry's due time, or the time the message was buried.
    at_ms: int


@dataclass(frozen=True, slots=True)
class ExhaustedClaim:
    id: str
    payload: str | None
    attempt: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """What the queue holds about one message, for listings and inspection."""

    id: str
    state: str
    # Due time (pending), deadline (unack) or burial time (garbage); None in the lists.
    score_ms: int | None
    payload: str | None
    payload_size: int
    lease: int | None
    attempt: int | None
    budget: int | None
    unannounced: bool = False

    @property
    def retries_left(self) -> int | None:
        if self.attempt is None or self.budget is None:
            return None
        return max(self.budget - max(self.attempt - 1, 0), 0)
