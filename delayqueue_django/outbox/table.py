"""The transactional outbox: ``send(..., outbox=True)`` writes each message as a row of the
``delayqueue_outbox`` table in the caller's database transaction, so it exists exactly when
that transaction commits; a relay (``delayqueue_django.relay``) moves committed rows to
Redis and deletes them.

A row keeps the message as ``send`` prepared it: its id (returned at once, as by any send),
the JSON payload, the retry budget and the due time, and a keyed send's key, ``if_exists``
and hold (``unique_for``), which the relay applies when it writes the row to Redis, in the
order of the rows' ids whatever the relays' timing (see relay.lua). The due time is fixed
when the row is written, on the clock of the process that writes it (``time.time()``,
which ``timezone.now()`` reads too): the delay counts from the ``send`` call, and a relay
that comes late, because Redis or every relay was away, never makes a message due later
than that; a time already past when it reaches Redis means due at once.
"""

import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import Count, Min, Q

from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.sharding.placement import SHARD_MARK, shard_suffix
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.outbox.databases import OUTBOX_DATABASES_SETTING, outbox_databases

# The most bytes of rows one INSERT carries: a send_many of many large messages is written
# in several INSERTs (in one transaction), each well under what a server takes in one
# statement: MariaDB's max_allowed_packet is 16 MiB by default, MySQL's 64 MiB, and the
# driver may escape a JSON payload to up to twice its size (each quote and backslash).
INSERT_BYTES = 4 * 1024 * 1024
# What a row costs in an INSERT besides its payload and id: its queue name, its numbers,
# the quotes and commas between them.
ROW_BYTES = 200


def _system_clock_us() -> int:
    return time.time_ns() // 1000


# The clock of the outbox's due times, in µs since the epoch: this process's, except inside
# delayqueue_django.testing.memory_queues(), whose queues have a clock of their own.
_clock_us: Callable[[], int] = _system_clock_us


def now_ms() -> int:
    """The clock of the outbox's due times, in ms since the epoch."""
    return _clock_us() // 1000


@contextmanager
def clock(now_us: Callable[[], int]) -> Iterator[None]:
    """Within the block, rows are written on this clock (a test's, see memory_queues)."""
    global _clock_us
    previous, _clock_us = _clock_us, now_us
    try:
        yield
    finally:
        _clock_us = previous


def due_ms(message: NewMessage, written_us: int) -> int:
    """A prepared message's absolute due time, for a row written at ``written_us`` (µs):
    its ``at_ms``, or its delay from then, rounded up to the ms as every due time is."""
    if message.at_ms is not None:
        return message.at_ms
    return -(-(written_us + message.delay_us) // 1000)


def expires_ms(message: NewMessage, written_us: int) -> int | None:
    """A prepared message's absolute expiry, for a row written at ``written_us`` (µs), as
    ``due_ms`` fixes its due time; None when it does not expire."""
    if message.expires_at_ms is not None:
        return message.expires_at_ms
    if message.expires_in_us > 0:
        return -(-(written_us + message.expires_in_us) // 1000)
    return None


def write(queue_name: str, messages: Sequence[NewMessage], *, using: str | None) -> None:
    """Write prepared messages as outbox rows in the current transaction on ``using`` (or
    one of their own outside a transaction: all or none), in INSERTs of at most
    INSERT_BYTES of rows each, and ring the relays of this process when it commits."""
    from delayqueue_django.outbox.models import OutboxMessage

    alias = using or DEFAULT_DB_ALIAS
    databases = outbox_databases()
    if alias not in databases:
        raise QueueConfigurationError(
            f"send(outbox=True) on database {alias!r}, which is not in "
            f"{OUTBOX_DATABASES_SETTING} ({', '.join(map(repr, databases)) or 'empty'}): "
            "no relay would read its outbox. Add it to that setting."
        )
    written_us = _clock_us()
    written = written_us // 1000
    rows = OutboxMessage.objects.using(alias)
    with transaction.atomic(using=alias, savepoint=False):
        for chunk in chunks_of(messages, INSERT_BYTES):
            rows.bulk_create(
                [
                    OutboxMessage(
                        queue=queue_name,
                        message_id=message.id,
                        payload=message.payload,
                        retry_count=message.budget,
                        due_ms=due_ms(message, written_us),
                        written_ms=written,
                        message_key=message.key,
                        if_exists=message.if_exists,
                        unique_ms=message.unique_ms,
                        message_group=message.group,
                        expires_ms=expires_ms(message, written_us),
                    )
                    for message in chunk
                ]
            )
        transaction.on_commit(doorbell.ring, using=alias)


def chunks_of(messages: Sequence[NewMessage], limit: int) -> Iterator[Sequence[NewMessage]]:
    """The messages in order, in runs whose rows take at most ``limit`` bytes by
    ROW_BYTES (a message larger than that alone in its run)."""
    if _most_bytes(messages) <= limit:
        # Fits however its text encodes: a send's single row, or a small send_many, is not
        # encoded to be measured.
        if messages:
            yield messages
        return
    start, size = 0, 0
    for end, message in enumerate(messages):
        row = ROW_BYTES + len(message.id) + len(message.payload.encode("utf-8"))
        if message.key is not None:
            row += len(message.key.encode("utf-8"))
        if size + row > limit and end > start:
            yield messages[start:end]
            start, size = end, 0
        size += row
    if start < len(messages):
        yield messages[start:]


def _most_bytes(messages: Sequence[NewMessage]) -> int:
    """What the messages' rows take at the most: UTF-8 takes up to 4 bytes a character."""
    return sum(
        ROW_BYTES + len(message.id) + 4 * (len(message.payload) + len(message.key or ""))
        for message in messages
    )


def waiting(queue_name: str) -> dict[str, int]:
    """A queue's rows waiting in the outbox tables of DELAYQUEUE_OUTBOX_DATABASES: ``outbox``
    (how many) and ``outbox_age_ms`` (how long the oldest has waited, on this process's
    clock; 0 when none waits). One aggregate query per database."""
    from delayqueue_django.outbox.models import OutboxMessage

    count, oldest = 0, None
    for alias in outbox_databases():
        found = (
            OutboxMessage.objects.using(alias)
            .filter(queue=queue_name)
            .aggregate(count=Count("id"), oldest=Min("written_ms"))
        )
        count += found["count"]
        if found["oldest"] is not None:
            oldest = found["oldest"] if oldest is None else min(oldest, found["oldest"])
    return {"outbox": count, "outbox_age_ms": 0 if oldest is None else max(now_ms() - oldest, 0)}


def bound_for_layout(queue_name: str, layout: int) -> int:
    """How many of a queue's rows waiting in the outbox tables of DELAYQUEUE_OUTBOX_DATABASES
    a relay will write to a shard of ``layout`` (an id names its shard; for layout 1, the
    keyed rows bound for shard 0, where its keys wait): messages of that layout as much as
    those in its shards, which its retiring must wait for. One count per database."""
    from delayqueue_django.outbox.models import OutboxMessage

    if layout == 1:
        bound = Q(message_key__isnull=False) & ~Q(message_id__contains=SHARD_MARK)
    else:
        bound = Q()
        for index in range(1, layout):
            bound |= Q(message_id__endswith=shard_suffix(layout, index))
    return sum(
        OutboxMessage.objects.using(alias).filter(bound, queue=queue_name).count()
        for alias in outbox_databases()
    )


def stranded(alias: str, configured: Collection[str]) -> dict[str, tuple[int, int]]:
    """The outbox rows on ``alias`` whose queue is not among ``configured``: no relay sends
    them (a relay reads only its own queues' rows). By queue name: how many, and when the
    oldest was written (ms since the epoch). One aggregate query."""
    from delayqueue_django.outbox.models import OutboxMessage

    found = (
        OutboxMessage.objects.using(alias)
        .exclude(queue__in=list(configured))
        .values("queue")
        .annotate(count=Count("id"), oldest=Min("written_ms"))
        .order_by("queue")
    )
    return {row["queue"]: (row["count"], row["oldest"]) for row in found}


def payload_of(queue_name: str, message_id: str) -> str | None:
    """The payload of a message still waiting in the outbox, or None."""
    from delayqueue_django.outbox.models import OutboxMessage

    for alias in outbox_databases():
        found = (
            OutboxMessage.objects.using(alias)
            .filter(queue=queue_name, message_id=message_id)
            .values_list("payload", flat=True)
            .first()
        )
        if found is not None:
            return found
    return None


class Doorbell:
    """Wakes the relays of this process when a transaction that wrote outbox rows commits,
    so that those rows reach Redis within milliseconds; rows written by other processes
    are found by polling."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: weakref.WeakSet[threading.Event] = weakref.WeakSet()

    def listen(self) -> threading.Event:
        """An event set at every ring from now on (clear it before looking at the outbox)."""
        event = threading.Event()
        with self._lock:
            self._listeners.add(event)
        return event

    def ring(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for event in listeners:
            event.set()


doorbell = Doorbell()
