"""EXACTLY_ONCE queues: a handler's database effects happen once per message.

The handler runs inside ``transaction.atomic()`` on the queue's database, whose first
statement records the message as processed (a row of ``delayqueue_processed``, unique per
queue, message id and generation: a keyed message replaced after it was handled runs again,
see engine/keyed.py). Its effects and that record commit together or not at all:

- the handler returns: both commit, then the worker acks (at least once, as always);
- it fails (returns False, raises, rejects): both roll back, and the message is retried or
  buried as on any queue;
- the worker dies after the commit and before the ack: the message is delivered again, its
  record is found, and it is acked without running the handler.

Two deliveries of one message running at once (a handler that outlived its delivery's
deadline) wait for each other on the record's unique key: the second runs only if the first
rolled back. Records are pruned ``EXACTLY_ONCE_RETENTION`` after they were written, once their
message has left the queue (acked, or a dead letter dropped).
"""

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from redis.exceptions import RedisClusterException, RedisError

from delayqueue_django.core import conf
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.outbox import mysql_errors
from delayqueue_django.outbox.key_deletes import delete_by_keys

logger = logging.getLogger("delayqueue_django.worker")

# Records deleted per statement when pruning, and statements per pruning round at most.
PRUNE_BATCH = 1000
PRUNE_BATCHES_PER_ROUND = 10
# libpq's PQtransactionStatus() of a transaction aborted by an error (psycopg 3's
# TransactionStatus.INERROR, psycopg2's TRANSACTION_STATUS_INERROR).
PQTRANS_INERROR = 3
# The pause between two tries of the record's INSERT on SQLite, each of which waits the
# busy timeout first: a connection whose timeout is 0 does not spin.
WRITE_LOCK_RETRY_SECONDS = 0.01


class AlreadyProcessed(Exception):
    """The message's transaction committed before: acked without running the handler."""


class WriteLockBusy(Exception):
    """SQLite's write lock stayed taken by other writers for as long as the handler may
    wait for it (half of MAX_CONSUME_DURATION): the handler never started, and the message
    is handed back without using an attempt."""


class _Refused(Exception):
    """The handler returned False: its transaction rolls back, the message is retried."""


class RolledBack(Exception):
    """The handler returned, but its transaction was marked for rollback (a database error
    caught inside it, or ``set_rollback(True)``), aborted by an error it caught (PostgreSQL)
    or rolled back by the server (a deadlock it caught, MySQL/MariaDB): nothing it wrote
    before, nor the processed record, would be committed, so the message is not acked but
    retried."""


class _ServerRollbacks:
    """An execute wrapper (``connection.execute_wrapper``) for a handler's statements on
    MySQL/MariaDB: notes the errors after which the server rolled the whole transaction back.
    Django does not mark the transaction for rollback then (the error may be caught outside
    any atomic block), and the statements after it run in a new transaction, which would
    commit without the processed record or the handler's earlier writes."""

    def __init__(self) -> None:
        self.codes: set[int] = set()

    def __call__(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        try:
            return execute(sql, params, many, context)
        except DatabaseError as error:
            # The errors after which the server may have rolled back the whole transaction,
            # not the statement alone.
            code = mysql_errors.error_code(error)
            if code in (mysql_errors.DEADLOCK, mysql_errors.LOCK_WAIT_TIMEOUT):
                self.codes.add(code)
            raise

    def rolled_back(self, using: str) -> bool:
        if mysql_errors.DEADLOCK in self.codes:
            return True
        if mysql_errors.LOCK_WAIT_TIMEOUT not in self.codes:
            return False
        # Asked only after such an error: the common path costs no query.
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT @@innodb_rollback_on_timeout")
            row = cursor.fetchone()
        return bool(row and row[0])


@dataclass
class _Running:
    """The transaction call_once runs a handler in: its database, the MySQL/MariaDB
    rollbacks noted so far, and what to call once it committed, or ended without."""

    using: str
    rollbacks: _ServerRollbacks = field(default_factory=_ServerRollbacks)
    if_rolled_back: list[Callable[[BaseException], None]] = field(default_factory=list)
    if_committed: list[Callable[[], object]] = field(default_factory=list)
    # Whether the handler was called: before, nothing but the record was written.
    started: bool = False


# Where each queue's pruning (by database alias and queue name) goes on at its next round:
# the (processed_ms, id) of the last record read by the last statement that completed, when
# that one stopped short of the end (also when the round failed after it). Kept per process:
# every worker walks all the records in its own rounds.
_prune_cursors: dict[tuple[str, str], tuple[int, int]] = {}

# Set while call_once runs a handler, for raise_if_rolled_back and on_rollback.
_running: ContextVar[_Running | None] = ContextVar("delayqueue_exactly_once", default=None)


def database_for(queue: str) -> str | None:
    """The database alias of an EXACTLY_ONCE queue, or None (a queue not configured, as in
    hand-made test setups, counts as at least once)."""
    config = conf.queue_configs().get(queue)
    return None if config is None else config.exactly_once


def committed(queue: str, message_id: str) -> bool:
    """Whether a message's handler committed, as far as its queue can tell: on an
    EXACTLY_ONCE queue, whether its processed record is there; elsewhere, True."""
    from delayqueue_django.outbox.models import ProcessedMessage

    using = database_for(queue)
    if using is None:
        return True
    records = ProcessedMessage.objects.using(using)
    try:
        return records.filter(queue=queue, message_id=message_id).exists()
    finally:
        # Asked from a thread no request cycle ends (announcing exhaustions): its connection
        # follows CONN_MAX_AGE as a handler's does, unless a caller's transaction holds it.
        connection = connections[using]
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def call_once(handler: Handler, message: Message, using: str) -> Any:
    """Run the handler in a transaction on ``using`` that records the message as processed.

    Returns what the handler returned; raises AlreadyProcessed if the message's transaction
    committed before (the handler did not run), WriteLockBusy if SQLite's write lock could
    not be had in time (nor did it), and whatever the handler raised.

    SQLite lets one transaction write at a time, and the record's INSERT, the transaction's
    first write, waits for the others only its busy timeout (5 s by default): as the
    handler has not started, the INSERT is tried again, up to half of MAX_CONSUME_DURATION
    (the handler keeps the other half).
    """
    config = conf.queue_configs().get(message.queue)
    wait_seconds = (config.max_consume_ms if config else 0) / 2000
    give_up = time.monotonic() + wait_seconds
    while True:
        try:
            return _call_once(handler, message, using)
        except WriteLockBusy:
            if time.monotonic() >= give_up:
                raise
            time.sleep(WRITE_LOCK_RETRY_SECONDS)
            logger.debug(
                "message id=%s queue=%s waits for SQLite's write lock on database %s",
                loggable(message.id),
                message.queue,
                using,
            )


def _call_once(handler: Handler, message: Message, using: str) -> Any:
    from delayqueue_django.outbox.models import ProcessedMessage

    running = _Running(using)
    try:
        with transaction.atomic(using=using):
            try:
                # In a savepoint of its own: a duplicate key aborts only it, not the
                # caller's transaction (in tests, the handler may run inside one).
                with transaction.atomic(using=using):
                    ProcessedMessage.objects.using(using).create(
                        queue=message.queue,
                        message_id=message.id,
                        generation=message.generation,
                        processed_ms=time.time_ns() // 1_000_000,
                    )
            except IntegrityError:
                raise AlreadyProcessed(message.id) from None
            running.started = True
            token = _running.set(running)
            try:
                if connections[using].vendor == "mysql":
                    with connections[using].execute_wrapper(running.rollbacks):
                        result = handler(message)
                else:
                    result = handler(message)
            finally:
                _running.reset(token)
            if result is False:
                raise _Refused
            # atomic() would roll back silently, or commit a transaction begun after the
            # server's rollback, and the message be acked as handled.
            _raise_if_rolled_back(message, running)
    except _Refused:
        return False
    except BaseException as error:
        if not running.started and _sqlite_busy(using, error):
            raise WriteLockBusy(
                f"message {message.id!r}: SQLite's write lock on database {using!r} stayed "
                "taken by other writers; the handler did not start"
            ) from error
        # The handler returned, and its transaction did not commit (its COMMIT failed, a
        # deferred constraint say, or it was rolled back): what it reported is undone.
        for callback in running.if_rolled_back:
            _call_logged(message, callback, error)
        raise
    # After the COMMIT, nothing may fail the delivery: it would be retried, found processed.
    for after in running.if_committed:
        _call_logged(message, after)
    return result


def _call_logged(message: Message, callback: Callable[..., object], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:
        logger.exception(
            "exactly-once callback %r failed message id=%s queue=%s",
            callback,
            loggable(message.id),
            message.queue,
        )


def on_commit(callback: Callable[[], object]) -> None:
    """Call ``callback()`` once the transaction call_once runs the handler in committed; at
    once outside call_once. For what a handler announces as done (a signal), which a
    failed COMMIT would belie."""
    running = _running.get()
    if running is None:
        callback()
    else:
        running.if_committed.append(callback)


def on_rollback(callback: Callable[[BaseException], None]) -> None:
    """Have ``callback(error)`` called if the transaction call_once runs the handler in ends
    without committing, once the handler returned; nothing outside call_once. For a handler
    that reports its success before returning (the Django Tasks runner)."""
    running = _running.get()
    if running is not None:
        running.if_rolled_back.append(callback)


def raise_if_rolled_back(message: Message) -> None:
    """Raise RolledBack if the transaction call_once runs the handler in will not commit;
    nothing outside call_once. For a handler that reports its outcome before returning
    (the Django Tasks runner): a transaction that rolls back is a failure, not a success."""
    running = _running.get()
    if running is not None:
        _raise_if_rolled_back(message, running)


def _raise_if_rolled_back(message: Message, running: _Running) -> None:
    using = running.using
    if (
        transaction.get_rollback(using=using)
        or _aborted(using)
        or running.rollbacks.rolled_back(using)
    ):
        raise RolledBack(
            f"message {message.id!r}: the handler returned, but its transaction on "
            f"database {using!r} was marked for rollback, aborted or rolled back by the "
            "server (a database error caught inside it, a deadlock, or "
            "set_rollback(True)); nothing it wrote was committed, so the message is "
            "retried. Catch database errors in a savepoint of their own "
            "(transaction.atomic()) inside an EXACTLY_ONCE handler, and let a "
            "deadlock propagate."
        )


def _delete(using: str, keys: list[int]) -> None:
    """Delete processed records by primary key, never waiting for the record of a handler
    running meanwhile (see key_deletes)."""
    from delayqueue_django.outbox.models import ProcessedMessage

    connection = connections[using]
    quote = connection.ops.quote_name
    sql = delete_by_keys(connection, quote(ProcessedMessage._meta.db_table), quote("id"), len(keys))
    with connection.cursor() as cursor:
        cursor.execute(sql, keys)


def _sqlite_busy(using: str, error: BaseException) -> bool:
    """Whether ``error`` is SQLite's "database is locked" (SQLITE_BUSY): another connection
    held the write lock past the busy timeout."""
    if connections[using].vendor != "sqlite" or not isinstance(error, OperationalError):
        return False
    code = getattr(error.__cause__, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _aborted(using: str) -> bool:
    """Whether the transaction on ``using`` is aborted on the server: PostgreSQL refuses
    every statement after an error until a rollback (even one the handler caught from a raw
    cursor, which Django does not mark for rollback), and turns the COMMIT into a ROLLBACK
    without an error."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    raw = connection.connection
    info = getattr(raw, "info", None)  # psycopg 3; psycopg2 has get_transaction_status()
    status = info.transaction_status if info is not None else raw.get_transaction_status()
    return bool(status == PQTRANS_INERROR)


def prune(queue: str, using: str, retention_ms: int) -> int:
    """Delete the processed records of ``queue`` written more than ``retention_ms`` ago
    whose message the queue no longer holds, in statements of PRUNE_BATCH, at most
    PRUNE_BATCHES_PER_ROUND of them; returns how many.

    Each statement reads a range of the index on (queue, processed_ms): only old records,
    never the whole table, whatever its size. A record outlives the retention while its
    message is still in the queue, in any state: a dead letter may be requeued (or a
    delivery come again) at any time, and must find it. One round trip to the queue's
    store per statement tells which are.

    Those kept may be many (dead letters kept for good): a round goes on from where the
    last one stopped (``_prune_cursors``; a failed one, after its last statement that
    completed), so each in turn reads the next of them, and
    after the newest ones the oldest again. A round that reaches the end with statements
    to spare goes on from the oldest, so the records behind a cursor wait no round more.
    """
    from delayqueue_django.core.registry import get_queue
    from delayqueue_django.outbox.models import ProcessedMessage

    cutoff = time.time_ns() // 1_000_000 - retention_ms
    records = ProcessedMessage.objects.using(using)
    cursor_key = (using, queue)
    after = _prune_cursors.get(cursor_key)
    # From the cursor to the end, then from the oldest: two ends at the most.
    ends_left = 1 if after is None else 2
    deleted = 0
    for _ in range(PRUNE_BATCHES_PER_ROUND):
        page = records.filter(queue=queue, processed_ms__lt=cutoff)
        if after is not None:
            # (processed_ms, id) past the cursor, as a range of the index.
            page = page.filter(processed_ms__gte=after[0]).exclude(
                processed_ms=after[0], id__lte=after[1]
            )
        old = list(
            page.order_by("processed_ms", "id").values_list("id", "message_id", "processed_ms")[
                :PRUNE_BATCH
            ]
        )
        if old:
            held = get_queue(queue).held([message_id for _, message_id, _ in old])
            gone = [key for key, message_id, _ in old if message_id not in held]
            if gone:
                _delete(using, gone)
                deleted += len(gone)
        if len(old) == PRUNE_BATCH:
            after = (old[-1][2], old[-1][0])
        else:
            after = None
            ends_left -= 1
        # Kept at once, not at the round's end: a round that fails at a later statement (a
        # shard's Redis, the database) leaves the next to go on past this one.
        if after is None:
            _prune_cursors.pop(cursor_key, None)
        else:
            _prune_cursors[cursor_key] = after
        if not ends_left:
            break
    return deleted


def prune_queues(names: Sequence[str]) -> int:
    """One pruning round for those of these queues that are EXACTLY_ONCE (each worker runs
    one for its queues once a minute)."""
    deleted = 0
    configs = conf.queue_configs()
    for name in names:
        config = configs.get(name)
        if config is None or config.exactly_once is None:
            continue
        try:
            deleted += prune(name, config.exactly_once, config.exactly_once_retention_ms)
        except (RedisError, RedisClusterException) as error:
            # Without its store, no record can be known unneeded: all wait for the next
            # round, and the other queues are pruned meanwhile.
            logger.warning("processed-message records of queue=%s not pruned: %s", name, error)
    if deleted:
        logger.info("deleted %d processed-message records past EXACTLY_ONCE_RETENTION", deleted)
    return deleted
