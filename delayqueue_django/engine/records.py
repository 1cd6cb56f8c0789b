"""Plain records passed in and out of the store, and the constants of its protocol."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import AnyStr

STATES = ("pending", "ready", "unack", "retry", "garbage")

# A nack with this delay buries the message at once, whatever its retry budget.
BURY = -1

# Lua holds numbers as doubles, exact up to 2**53: the scripts read a meta record or a
# schedule's tick record with a larger field as damaged (they would round it, and "%d"
# writes some back negative), and so does Python (_prelude.lua's parse_meta).
LARGEST_META_NUMBER = 2**53 - 1


def meta_numbers(fields: Sequence[str]) -> list[int] | None:
    """A meta record's fields as numbers, or None unless each is ASCII digits no larger
    than LARGEST_META_NUMBER. (``str.isdigit`` alone also takes "²", which int() refuses.)"""
    numbers = []
    for field in fields:
        if not (field.isascii() and field.isdigit()):
            return None
        number = int(field)
        if number > LARGEST_META_NUMBER:
            return None
        numbers.append(number)
    return numbers


def printable(text: str) -> str:
    """``text`` fit to show, log or encode anywhere. An id read from Redis whose bytes are not
    UTF-8 (only a foreign write stores such) carries them as surrogate escapes, so that it
    goes back as the same bytes; here they become backslash escapes (b"\\xff" -> "\\xff")."""
    if text.isascii():
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate of another kind, given by a caller
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def loggable(text: str) -> str:
    """``text`` fit for one log line: ``printable``, and each character that prints nothing
    (line breaks, tabs, terminal escapes, Unicode's line separators and bidi controls) as
    the escape ``repr`` writes for it ("\\n", "\\x1b", "\\u2028"). An id or a schedule name
    from outside (a form, a foreign write) then cannot start a line that passes for a log
    record of its own; an ordinary one is logged as it is. (A backslash stays one, as in
    ``printable``: the escapes are there to be read, not parsed back.)"""
    shown = printable(text)
    if shown.isprintable():
        return shown
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in shown)


@dataclass(frozen=True)
class StoreLimits:
    """Bounds that keep every script call short."""

    # How long a delivery may stay unacked before it is redelivered.
    consume_ms: int = 30_000
    # The most messages one fetch moves (expired + due) and the staging lists' length.
    stage_limit: int = 1000
    # Messages per send script call; a bulk send is cut into calls of this size.
    send_batch_size: int = 1000
    # The queue's flow gates: at most rate_limit[0] hand-outs per rate_limit[1] ms, and at
    # most max_in_flight deliveries in flight (0: no cap). Every shard of a sharded queue
    # has the whole queue's: its fetches enforce them on one shard, its reservations on
    # shard 0 on several (see engine.flow).
    rate_limit: tuple[int, int] | None = None
    max_in_flight: int = 0
    # The most attempt records a message keeps (HISTORY_ATTEMPTS; 0: none written).
    history_attempts: int = 5
    # How long a message that ended leaves its outcome record (HISTORY_RETENTION; see
    # engine.outcomes), in ms: 0 keeps none, and the scripts are given nothing more.
    outcome_ms: int = 0


# A traced send puts its span's W3C traceparent before the payload, as "^<traceparent>^"
# (see delayqueue_django/core/tracing.py); JSON text never starts with "^". Untraced messages
# are stored as they always were.
TRACE_MARK = "^"


def split_trace(text: AnyStr) -> tuple[AnyStr, AnyStr]:
    """``(traceparent, payload)`` of a stored payload, as text or as the bytes stored; empty
    and the payload when untraced."""
    mark = TRACE_MARK if isinstance(text, str) else TRACE_MARK.encode()
    if text[:1] != mark:
        return text[:0], text
    end = text.find(mark, 1)
    if end < 0:
        return text[:0], text
    return text[1:end], text[end + 1 :]


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to schedule: due at ``at_ms`` (or the store's now, if that is past), or
    ``delay_us`` microseconds after the store runs the send, rounded up to the ms."""

    id: str
    payload: str
    budget: int
    at_ms: int | None = None
    delay_us: int = 0
    # The user's key (see engine/keyed.py); what a send does when the key's message waits
    # ("keep", "replace" or "error"); and how long the key stays taken after this send
    # creates its message, whatever becomes of it (0: no hold).
    key: str | None = None
    if_exists: str = "keep"
    unique_ms: int = 0
    # The message's ordered group (see "Ordered groups" in _prelude.lua): None for none.
    group: str | None = None
    # When the message expires, if it does: at ``expires_at_ms``, or ``expires_in_us``
    # microseconds after the store runs the send (rounded up to the ms, as a delay). Never
    # handed out from then on (see "Expiry and postpones" in _prelude.lua).
    expires_at_ms: int | None = None
    expires_in_us: int = 0
    # The outbox row a relay brings a keyed message from: (database alias, row id). A key
    # decides the rows of one database in the order of their ids, whichever relay brings
    # them first (see "Outbox rows" in _prelude.lua). None for every other send.
    outbox_row: tuple[str, int] | None = None

    @property
    def expires(self) -> bool:
        return self.expires_at_ms is not None or self.expires_in_us > 0


@dataclass(frozen=True, slots=True)
class KeyedSent:
    """What a keyed send did: ``outcome`` is "created" (a new message, or a replay of one
    whose reply was lost), "kept" (the key's waiting message left as it was), "replaced"
    (the key's waiting message given the new payload and due time) or "held" (a unique_for
    hold on the key stopped it: nothing sent). ``id`` is the message the key names;
    ``due_ms`` its due time, None when it is not waiting."""

    id: str
    outcome: str
    due_ms: int | None


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
    # Why the delivery cannot be handled: its id or payload is not UTF-8 text (only a
    # foreign write puts such bytes in Redis). Queue.fetch buries it. Empty when sound.
    unreadable: str = ""
    # The user's key and the message's generation (engine/keyed.py); None and 0 unkeyed.
    key: str | None = None
    generation: int = 0
    # Its ordered group (see "Ordered groups" in _prelude.lua); None for none.
    group: str | None = None
    # False when the fetch found no expiry, postpone count nor ordered group in the queue:
    # its ack need not look for them ("untracked" in ack.lua). True when not known.
    tracked: bool = True


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
    # How far read_at may be off (s): half the round trip in which the clock was read.
    read_within: float = 0.0
    # A shard of a sharded queue fetched without a reservation took nothing: the queue has
    # a rate set at run time, and its fetches must reserve (see engine.flow).
    unreserved: bool = False
    # MAX_IN_FLIGHT held waiting work back (next_ms is then the held-back look, a second
    # on): a slot an ack frees lets some of it go, so the acker should fetch again at once.
    capped: bool = False


@dataclass(frozen=True, slots=True)
class NackOutcome:
    id: str
    exhausted: bool
    # The retry's due time, or the time the message was buried.
    at_ms: int
    # A keyed message not retried because a newer message with its key waits: removed.
    superseded: bool = False
    # Why a buried message died when it is not the default (retries used up, or BURY):
    # EXPIRED (its retry would have come at or after its expiry) or POSTPONED_TOO_OFTEN.
    dead_reason: str = ""


# Dead reasons other than the default (see "Expiry and postpones" in _prelude.lua).
EXPIRED = "expired"
POSTPONED_TOO_OFTEN = "postponed too often"


@dataclass(frozen=True, slots=True)
class ExhaustedClaim:
    id: str
    payload: str | None  # None when it is missing or not UTF-8 text
    attempt: int
    # When the claim lapses (ms, store clock); also its token: confirming it removes the
    # exhaustion only while this claim still holds it.
    claimed_until_ms: int
    key: str | None = None
    # Why it died: "" (retries used up, or rejected), EXPIRED or POSTPONED_TOO_OFTEN.
    reason: str = ""
    # Its ordered group (None: none).
    group: str | None = None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """What the queue holds about one message, for listings and inspection."""

    id: str
    state: str
    # Due time (pending), deadline (unack) or burial time (garbage); None in the lists.
    score_ms: int | None
    # None when missing; bytes that are not UTF-8 shown as backslash escapes ("\\xff").
    payload: str | None
    payload_size: int
    lease: int | None
    attempt: int | None
    budget: int | None
    unannounced: bool = False
    key: str | None = None
    generation: int = 0
    # Its ordered group (None: none).
    group: str | None = None
    # A dead letter's reason when it is not the default (see NackOutcome.dead_reason).
    dead_reason: str = ""
    # The newest of its attempt records (see Attempt), where the read fills it in (a dead
    # letter's peek and listing); None when it has none.
    last_error: "Attempt | None" = None
    # A message that ended, read from its outcome record (see engine.outcomes; its state is
    # then one of ENDED_STATES, or DAMAGED_OUTCOME): when it ended, and the worker that
    # acked it. None for a message still stored.
    ended_at: datetime | None = None
    worker: str | None = None

    @property
    def retries_left(self) -> int | None:
        if self.attempt is None or self.budget is None:
            return None
        return max(self.budget - max(self.attempt - 1, 0), 0)


# Attempt records (see "Attempt records" in _prelude.lua): why each refused delivery of a
# message was refused. The verdicts:
ERROR = "error"  # the handler raised
NACK = "nack"  # the handler returned False
RETRY = "retry"  # the handler raised Retry
REJECT = "reject"  # the handler raised Reject: a dead letter at once
POSTPONE = "postpone"  # the handler raised Postpone
TIME_LIMIT = "time limit"  # the handler ran past TIME_LIMIT (TimeLimitExceeded)
LEASE_EXPIRED = "lease expired"  # no verdict came before the lease ran out (worker died)
# EXPIRED and POSTPONED_TOO_OFTEN (above): a refusal that buried the message for that
# reason, whatever the handler did (its error is kept all the same).
VERDICTS = (
    ERROR,
    NACK,
    RETRY,
    REJECT,
    POSTPONE,
    TIME_LIMIT,
    LEASE_EXPIRED,
    EXPIRED,
    POSTPONED_TOO_OFTEN,
)


def moment_of_ms(ms: int) -> datetime | None:
    """``ms`` since the epoch (Redis's clock, as a record keeps it) as an aware datetime,
    exact to the ms; None past datetime's range (only a damaged record holds such a time)."""
    try:
        return datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)
    except (OverflowError, ValueError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One refused delivery of a message, as its verdict's script recorded it."""

    attempt: int
    verdict: str
    # The exception's class as "module.qualname", its text and the tail of its traceback;
    # empty when there was none (a handler that returned False, a lease that ran out).
    error_class: str = ""
    error: str = ""
    traceback: str = ""
    # "host:pid" of the worker that ran it; empty when not known (a lease that ran out).
    worker: str = ""
    # On Redis's clock: when the handler started (the worker's estimate; None when not
    # known) and when the verdict was written.
    started_at: datetime | None = None
    ended_at: datetime | None = None
    # The text and the traceback were cut to their bounds (the traceback keeps its tail).
    error_cut: bool = False
    traceback_cut: bool = False
    # Why the record could not be read in full (damaged, missing fields, not UTF-8, a key
    # of another type): what could be read is shown, the rest empty. Empty when sound.
    damaged: str = ""


# A message's attempt records, oldest first (a name of its own: the stores' classes have a
# method named list).
Attempts = list[Attempt]


# Schedules (schedule.lua): a schedule's ticks are messages with ids of this form.
TICK_ID_PREFIX = "tick:"


def tick_id(schedule: str, at_ms: int) -> str:
    """The id of a schedule's tick at ``at_ms``: one message per tick time."""
    return f"{TICK_ID_PREFIX}{schedule}:{at_ms}"


def parse_tick_id(message_id: str) -> tuple[str, int] | None:
    """``(schedule, tick ms)`` of a tick's id, or None for any other message."""
    if not message_id.startswith(TICK_ID_PREFIX):
        return None
    schedule, _, at = message_id[len(TICK_ID_PREFIX) :].rpartition(":")
    if not schedule or not (at.isascii() and at.isdigit()):
        return None
    return schedule, int(at)


@dataclass(frozen=True, slots=True)
class Tick:
    """A tick to write: the message due at ``at_ms``, carrying ``payload``."""

    at_ms: int
    budget: int
    payload: str


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One schedule as the store keeps it (see schedule.lua): its definition (JSON, None if
    missing) and where its ticks stand (fingerprint None if that record is missing)."""

    name: str
    definition: str | None
    fingerprint: str | None
    paused: bool = False
    # A tick is written only if later than the cursor (ms).
    cursor_ms: int = 0
    # The latest tick written since it was defined, changed or paused, and the one before
    # it (ms, 0 if none).
    tick_ms: int = 0
    previous_ms: int = 0
    # Why a worker could not write its ticks (see ScheduleFailure), None while none failed.
    failure: "ScheduleFailure | None" = None
    # A tick of a time at or before this (ms) that is handed out now was written before the
    # schedule was added or last resumed: it is not run (0: none such).
    since_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleFailure:
    """A schedule whose ticks a worker could not write (its task's queue has no Tasks
    backend, its stored definition is unreadable, ...): why, and since when (ms). Kept until a
    tick of it is written, its definition is changed, or it is removed."""

    reason: str
    since_ms: int


# The longest reason a failure keeps: enough for an exception's message.
LONGEST_FAILURE_REASON = 500


def parse_schedule_failure(raw: str | None) -> ScheduleFailure | None:
    """A failure as schedule.lua stores it, "since:reason"; None if there is none, or it is
    unreadable (a foreign write: nothing to show)."""
    since, _, reason = (raw or "").partition(":")
    numbers = meta_numbers([since]) if since else None
    return None if numbers is None else ScheduleFailure(reason, numbers[0])


@dataclass(frozen=True, slots=True)
class ScheduleReply:
    """What a schedule call did (see schedule.lua), and the record after it."""

    status: str
    cursor_ms: int
    tick_ms: int
    previous_ms: int
    now_ms: int


# The store's clock (ms) and every schedule, by name.
ScheduleListing = tuple[int, list[ScheduleRecord]]


def parse_schedule_record(
    name: str, definition: str | None, raw: str | None, failure: str | None = None
) -> ScheduleRecord:
    """A schedule from its definition, its "fingerprint:paused:cursor:tick:previous:since"
    record (without since, as written before it was kept: since 0) and its failure; an
    unreadable record (a number past LARGEST_META_NUMBER too) reads as missing, as
    schedule.lua takes it."""
    parts = raw.split(":") if raw is not None else []
    fields = parts[2:] if len(parts) == 6 else [*parts[2:], "0"]
    readable = len(parts) in (5, 6) and parts[1] in ("0", "1")
    numbers = meta_numbers(fields) if readable else None
    fingerprint = parts[0] if numbers is not None else ""
    if numbers is None or not all(c in "0123456789abcdefABCDEF" for c in fingerprint):
        return ScheduleRecord(name, definition, None)
    cursor, tick, previous, since = numbers
    return ScheduleRecord(
        name,
        definition,
        fingerprint,
        parts[1] == "1",
        cursor,
        tick,
        previous,
        parse_schedule_failure(failure),
        since,
    )
