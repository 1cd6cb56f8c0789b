"""EXACTLY_ONCE queues: a handler's database effects happen once per message.

The handler runs inside ``transaction.atomic()`` on the queue's database, whose first
statement records the message as processed (a row of ``delayqueue_processed``, unique per
queue and message id). Its effects and that record commit together or not at all:

- the handler returns: both commit, then the worker acks (at least once, as always);
- it fails (returns False, raises, rejects): both roll back, and the message is retried or
  buried as on any queue;
- the worker dies after the commit and before the ack: the message is delivered again, its
  record is found, and it is acked without running the handler.

Two deliveries of one message running at once (a handler that outlived its delivery's
deadline) wait for each other on the record's unique key: the second runs only if the first
rolled back. Records are pruned ``EXACTLY_ONCE_RETENTION`` after they were written.
"""

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from delayqueue_django.core import conf
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.outbox import mysql_errors
from delayqueue_django.outbox.key_deletes import delete_by_keys

logger = logging.getLogger("delayqueue_django.worker")

# Records deleted per statement when pruning, and statements per pruning round at most.
PRUNE_BATCH = 1000
PRUNE_BATCHES_PER_ROUND = 10
# libpq's PQtransactionStatus() of a transaction aborted by an error (psycopg 3's
# TransactionStatus.INERROR, psycopg2's TRANSACTION_STATUS_INERROR).
PQTRANS_INERROR = 3


class AlreadyProcessed(Exception):
    """The message's transaction committed before: acked without running the handler."""


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


def database_for(queue: str) -> str | None:
    """The database alias of an EXACTLY_ONCE queue, or None (a queue not configured, as in
    hand-made test setups, counts as at least once)."""
    config = conf.queue_configs().get(queue)
    return None if config is None else config.exactly_once


def call_once(handler: Handler, message: Message, using: str) -> Any:
    """Run the handler in a transaction on ``using`` that records the message as processed.

    Returns what the handler returned; raises AlreadyProcessed if the message's transaction
    committed before (the handler did not run), and whatever the handler raised.
    """
    from delayqueue_django.outbox.models import ProcessedMessage

    try:
        with transaction.atomic(using=using):
            try:
                # In a savepoint of its own: a duplicate key aborts only it, not the
                # caller's transaction (in tests, the handler may run inside one).
                with transaction.atomic(using=using):
                    ProcessedMessage.objects.using(using).create(
                        queue=message.queue,
                        message_id=message.id,
                        processed_ms=time.time_ns() // 1_000_000,
                    )
            except IntegrityError:
                raise AlreadyProcessed(message.id) from None
            rollbacks = _ServerRollbacks()
            if connections[using].vendor == "mysql":
                with connections[using].execute_wrapper(rollbacks):
                    result = handler(message)
            else:
                result = handler(message)
            if result is False:
                raise _Refused
            if (
                transaction.get_rollback(using=using)
                or _aborted(using)
                or rollbacks.rolled_back(using)
            ):
                # atomic() would roll back silently, or commit a transaction begun after
                # the server's rollback, and the message be acked as handled.
                raise RolledBack(
                    f"message {message.id!r}: the handler returned, but its transaction on "
                    f"database {using!r} was marked for rollback, aborted or rolled back by the "
                    "server (a database error caught inside it, a deadlock, or "
                    "set_rollback(True)); nothing it wrote was committed, so the message is "
                    "retried. Catch database errors in a savepoint of their own "
                    "(transaction.atomic()) inside an EXACTLY_ONCE handler, and let a "
                    "deadlock propagate."
                )
            return result
    except _Refused:
        return False


def _delete(using: str, keys: list[int]) -> None:
    """Delete processed records by primary key, never waiting for the record of a handler
    running meanwhile (see key_deletes)."""
    from delayqueue_django.outbox.models import ProcessedMessage

    connection = connections[using]
    quote = connection.ops.quote_name
    sql = delete_by_keys(connection, quote(ProcessedMessage._meta.db_table), quote("id"), len(keys))
    with connection.cursor() as cursor:
        cursor.execute(sql, keys)


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
    """Delete the processed records of ``queue`` written more than ``retention_ms`` ago, in
    statements of PRUNE_BATCH, at most PRUNE_BATCHES_PER_ROUND of them; returns how many.

    Each statement reads a range of the index on (queue, processed_ms): only old records,
    never the whole table, whatever its size.
    """
    from delayqueue_django.outbox.models import ProcessedMessage

    cutoff = time.time_ns() // 1_000_000 - retention_ms
    records = ProcessedMessage.objects.using(using)
    deleted = 0
    for _ in range(PRUNE_BATCHES_PER_ROUND):
        old = list(
            records.filter(queue=queue, processed_ms__lt=cutoff)
            .order_by("id")
            .values_list("id", flat=True)[:PRUNE_BATCH]
        )
        if old:
            _delete(using, old)
            deleted += len(old)
        if len(old) < PRUNE_BATCH:
            break
    return deleted


def prune_queues(names: Sequence[str]) -> int:
    """One pruning round for those of these queues that are EXACTLY_ONCE (each worker runs
    one for its queues once a minute)."""
    deleted = 0
    configs = conf.queue_configs()
    for name in names:
        config = configs.get(name)
        if config is not None and config.exactly_once is not None:
            deleted += prune(name, config.exactly_once, config.exactly_once_retention_ms)
    if deleted:
        logger.info("deleted %d processed-message records past EXACTLY_ONCE_RETENTION", deleted)
    return deleted
