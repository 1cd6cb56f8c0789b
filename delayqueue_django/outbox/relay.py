"""The outbox relay: moves committed outbox rows to their queues in Redis and deletes them.

One batch is one database transaction: take up to ``batch_size`` rows of each queue, each
queue's oldest first, deleting them (on PostgreSQL and SQLite in one ``DELETE ...
RETURNING`` statement; elsewhere a ``SELECT ... FOR UPDATE`` a queue and a ``DELETE``);
write their messages to Redis (the relay script, one call per lane, a queue or a shard of
one, and ``SEND_BATCH_SIZE`` chunk, pipelined in one round trip; the lanes at once); commit.
A lane whose Redis refuses, cannot be reached or stays silent for LANE_PATIENCE_SECONDS
holds back only its own rows: they go back to the table in the same transaction, and wait,
left out of the relay's reads, until that Redis answers again (see relay_lanes), while the
other queues' and shards' rows flow. On PostgreSQL and MariaDB the server ends a batch's
transaction that sits idle longer than
``RELAY_IDLE_LIMIT_SECONDS``, freeing its rows should the relay vanish mid-batch.

A key's rows are decided in the order of their ids, however many relays run and whatever
their timing: a relay that stalls between its take and its Redis call may bring a key's
older row after another relay brought a newer one, and the key's message remembers the
newest row (of each database) whose replace wrote it, so the older replace writes nothing
(see "Outbox rows" in the scripts' prelude). Each message carries its row for that.

Nothing is sent twice, however many relays run and whenever one dies:

- Two relays never hold the same row: PostgreSQL and MySQL/MariaDB lock the rows taken and
  other relays skip them (``SKIP LOCKED``); SQLite has no row locks, but its ``DELETE`` takes
  the database's write lock, so relays there take turns (and a relay holds that lock while
  Redis answers: about a millisecond, up to the Redis client's socket timeout when Redis
  hangs, during which other writers wait).
- A relay that dies after Redis accepted its batch and before its commit leaves the rows to
  be relayed again: the relay script notes every id it writes in the queue's
  ``…:relayed`` set and writes nothing for an id noted there, even once that message was
  handled and acked. A relay forgets the ids of a batch whose delete committed with its
  next call; the ids of a relay that died are forgotten by the relay that takes their rows
  next, or after ``RELAY_RECORD_MS``.
"""

import functools
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from typing import Any

from django.db import DatabaseError, OperationalError, connections, transaction
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core.backoff import Backoff
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.sharding.placement import SHARD_MARK
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.outbox import mysql_errors
from delayqueue_django.outbox.databases import outbox_databases
from delayqueue_django.outbox.key_deletes import delete_by_keys
from delayqueue_django.outbox.queue_index import QueueIndex
from delayqueue_django.outbox.relay_lanes import Lane, Lanes, describe, lane_of, start_call
from delayqueue_django.outbox.table import doorbell

logger = logging.getLogger("delayqueue_django.relay")

# Rows of each queue taken in one transaction.
RELAY_BATCH_SIZE = 1000
# How often a relay looks for rows that other processes committed (its own process's
# commits wake it at once).
RELAY_POLL_SECONDS = 0.5
# How long an id stays noted as relayed when no relay learns that its row's delete
# committed (see relay.lua), counted from the last relay of that id: far longer than any
# database outage that could hold it back.
RELAY_RECORD_MS = 7 * 24 * 3600 * 1000
# How often a batch chosen as a MySQL/MariaDB deadlock's victim is tried again at once.
DEADLOCK_RETRIES = 5
# How long a relay's transaction may sit idle on PostgreSQL/MariaDB before the server ends
# the session, and with it the transaction and its row locks. It idles only while Redis
# answers the batch, LANE_PATIENCE_SECONDS at the most (a lane's call itself may go on, in
# its own thread, until redis-py gives up: with the package's defaults, 5 s connect and
# socket timeouts and redis-py 8's 10 retries with backoff under 1 s, about 2 min at the
# worst). Without a bound, a relay whose host vanished mid-batch holds its rows until the
# server notices the dead connection (PostgreSQL's keepalive: about 2 h; MariaDB's
# wait_timeout: 8 h), and every other relay skips them meanwhile. Far above any batch, with
# room for a process that stalls: a relay cut short by it only rolls back and relays its
# rows again (relay.lua writes nothing twice).
RELAY_IDLE_LIMIT_SECONDS = 300.0
# How often a database without the outbox table (not migrated yet) is looked at again.
MISSING_TABLE_SECONDS = 60.0
# How long a drain waits before looking again at rows other relays hold.
DRAIN_WAIT_SECONDS = 0.01
# Ids to forget that wait for Redis, per queue, at most (older ones are forgotten by age).
PENDING_FORGET_LIMIT = 100_000
# How long a batch waits for its lanes' Redis calls (made all at once, each in a thread of
# its own). A lane that has not answered by then counts as failed: its rows go back to the
# table and the lane is held back, while its call goes on (what it writes is noted in the
# relayed set, and written once). Far above a healthy call (milliseconds, a second on a
# machine under heavy load), far below what a hung master costs: redis-py's socket timeout
# and retries, up to about 2 minutes, poll after poll.
LANE_PATIENCE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class OutboxRow:
    pk: int
    queue: str
    message_id: str
    payload: str
    retry_count: int
    due_ms: int
    written_ms: int
    message_key: str | None
    if_exists: str
    unique_ms: int
    message_group: str | None
    expires_ms: int | None
    # The database the row was taken from (not a column): a keyed row's place in the order
    # of its key's rows is its id on that database.
    database: str

    def message(self) -> NewMessage:
        """The message the row keeps, as its send prepared it (a keyed one with its row,
        by which its key decides it in row order: see relay.lua)."""
        return NewMessage(
            self.message_id,
            self.payload,
            self.retry_count,
            at_ms=self.due_ms,
            key=self.message_key,
            if_exists=self.if_exists,
            unique_ms=self.unique_ms,
            group=self.message_group,
            expires_at_ms=self.expires_ms,
            outbox_row=None if self.message_key is None else (self.database, self.pk),
        )


# The outbox table's columns a relay reads, in OutboxRow's order.
ROW_FIELDS = tuple(field.name for field in fields(OutboxRow) if field.name != "database")
ROW_COLUMNS = ("id", *ROW_FIELDS[1:])


@dataclass(slots=True)
class _Scheduled:
    seconds: float
    step: Callable[[], object]
    next_at: float = 0.0


class OutboxRelay:
    """Relays the outbox rows of ``queues`` found on ``databases`` (default:
    DELAYQUEUE_OUTBOX_DATABASES)."""

    def __init__(
        self,
        queues: Sequence[Queue],
        *,
        databases: Sequence[str] | None = None,
        batch_size: int = RELAY_BATCH_SIZE,
        poll_seconds: float = RELAY_POLL_SECONDS,
        idle_limit_seconds: float = RELAY_IDLE_LIMIT_SECONDS,
        lane_patience_seconds: float = LANE_PATIENCE_SECONDS,
    ) -> None:
        self.queues = {queue.name: queue for queue in queues}
        self.databases = list(outbox_databases() if databases is None else databases)
        self.batch_size = batch_size
        self.poll_seconds = poll_seconds
        self.idle_limit_seconds = idle_limit_seconds
        self.lane_patience_seconds = lane_patience_seconds
        # Written to Redis / found relayed before (the rows deleted all the same).
        self.relayed = 0
        self.repeated = 0
        self._forget: dict[Lane, list[str]] = {}
        self._stopping = threading.Event()
        self._wake = doorbell.listen()
        self._lanes = Lanes(on_recovered=self._wake.set)
        self._missing_tables: set[str] = set()
        self._queue_index = QueueIndex()
        # has_rows' SQL, by database and the lanes held then (see has_rows).
        self._looks: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}

    # One batch

    def relay_batch(self, alias: str) -> int:
        """Relay one batch from database ``alias``; returns how many rows it took."""
        if not self.queues:
            return 0
        attempt = 1
        while True:
            try:
                return self._relay_batch(alias)
            except OperationalError as error:
                # MySQL/MariaDB: relays racing can deadlock on their DELETEs (a range read
                # may end on a row another relay holds). The victim InnoDB rolled back had
                # sent nothing yet (the DELETE comes first): it only has to try again.
                code = mysql_errors.error_code(error)
                if code == mysql_errors.KEY_DOES_NOT_EXIST and self._queue_index.forget(alias):
                    # The index forced was dropped meanwhile: read without it.
                    continue
                if code != mysql_errors.DEADLOCK or attempt >= DEADLOCK_RETRIES:
                    raise
                attempt += 1

    def _relay_batch(self, alias: str) -> int:
        held: list[OutboxRow] = []
        with transaction.atomic(using=alias):
            rows = self._take(alias)
            if rows:
                with self._idle_limit(alias):
                    held = self._send(rows)
                if held:
                    self._put_back(alias, held)
        # Committed: the rows sent are gone for good, their ids may be forgotten.
        kept = {row.pk for row in held}
        for row in rows:
            if row.pk not in kept:
                self._forget.setdefault(lane_of(row.queue, row.message_id), []).append(
                    row.message_id
                )
        return len(rows)

    def _take(self, alias: str) -> list[OutboxRow]:
        """Take (delete, in the transaction) up to batch_size rows of each of our queues.

        Each queue's oldest rows are read on their own, in order through the outbox's
        (queue, id) index, up to the LIMIT: no row of another queue is read, nor any row
        past the LIMIT. One "queue IN (...) ORDER BY id" would not read the index in order:
        planners scan the table by id (through every other queue's rows) or read and sort
        all the rows of those queues, and on MySQL/MariaDB lock every row so read."""
        from delayqueue_django.outbox.models import OutboxMessage

        connection = connections[alias]
        quote = connection.ops.quote_name
        table = quote(OutboxMessage._meta.db_table)
        columns = ", ".join(quote(name) for name in ROW_COLUMNS)
        # In one order for every relay, whatever order its queues were given in: relays that
        # wait for each other's row locks (MySQL/MariaDB without SKIP LOCKED) then take
        # them in the same order, and cannot deadlock.
        names = sorted(self.queues)
        key, queue = quote("id"), quote("queue")
        # The held lanes' rows are left out of each queue's read (see Lanes.where).
        held = {name: self._lanes.where(quote, [name]) for name in names}
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql" or (
                connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)
            ):
                # One statement. PostgreSQL skips the rows another relay holds; on SQLite the
                # DELETE takes the write lock first, and another relay waits for it.
                lock = " FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
                oldest = " UNION ALL ".join(
                    f"SELECT {key} FROM (SELECT {key} FROM {table} WHERE {queue} = %s"
                    f"{held[name][0]} ORDER BY {key} LIMIT %s{lock}) AS {quote(f'oldest_{n}')}"
                    for n, name in enumerate(names)
                )
                # PostgreSQL plans "id IN (the oldest rows)" as a hash join over a scan of
                # the whole table once the batch is a fair share of it (every row waiting
                # read by each batch: 13 ms a batch of 1,000 at 100,000 rows, here): an
                # array, computed first, leaves the DELETE lookups by key (1 ms).
                postgresql = connection.vendor == "postgresql"
                taken = f"= ANY(ARRAY({oldest}))" if postgresql else f"IN ({oldest})"
                parameters: list[str | int] = []
                for name in names:
                    parameters += [name, *held[name][1], self.batch_size]
                cursor.execute(
                    f"DELETE FROM {table} WHERE {key} {taken} RETURNING {columns}",
                    parameters,
                )
                found = cursor.fetchall()
            else:
                skip = connection.features.has_select_for_update_skip_locked
                lock = " FOR UPDATE SKIP LOCKED" if skip else " FOR UPDATE"
                if not connection.features.has_select_for_update:
                    lock = ""
                # MySQL/MariaDB may plan a scan when a young table's statistics are stale,
                # which would lock rows other relays hold (past the LIMIT), and the DELETE
                # then wait for, and deadlock with, other relays: the index is forced,
                # once migration 0003 created it.
                mysql = connection.vendor == "mysql"
                by_index = self._queue_index.force(alias) if mysql else ""
                found = []
                for name in names:
                    cursor.execute(
                        f"SELECT {columns} FROM {table}{by_index} WHERE {queue} = %s"
                        f"{held[name][0]} ORDER BY {key} LIMIT %s{lock}",
                        [name, *held[name][1], self.batch_size],
                    )
                    found.extend(cursor.fetchall())
                if found:
                    keys = [row[0] for row in found]
                    cursor.execute(delete_by_keys(connection, table, key, len(keys)), keys)
        rows = [
            OutboxRow(**dict(zip(ROW_FIELDS, row, strict=True)), database=alias) for row in found
        ]
        rows.sort(key=lambda row: row.pk)
        return rows

    @contextmanager
    def _idle_limit(self, alias: str) -> Iterator[None]:
        """Within the block, the server ends this transaction's session once it has sat
        idle for idle_limit_seconds (see RELAY_IDLE_LIMIT_SECONDS): the rows taken are then
        free for other relays however this one died. SQLite needs none (a dead process
        holds no lock), nor has MySQL (its wait_timeout applies)."""
        connection = connections[alias]
        if connection.vendor == "postgresql":
            # Ends with the transaction (SET LOCAL); set_config takes its value as a
            # parameter, whatever the driver's binding.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                    [str(math.ceil(self.idle_limit_seconds * 1000))],
                )
            yield
            return
        if connection.vendor != "mysql" or not getattr(connection, "mysql_is_mariadb", False):
            yield
            return
        # A session variable (10.3+, whole seconds): set for this transaction, and the
        # session's own value restored before its commit, for the connection's other uses.
        with connection.cursor() as cursor:
            cursor.execute(
                "SET @delayqueue_idle = @@session.idle_transaction_timeout, "
                "@@session.idle_transaction_timeout = %s",
                [math.ceil(self.idle_limit_seconds)],
            )
        restore = "SET @@session.idle_transaction_timeout = @delayqueue_idle"
        try:
            yield
        except BaseException:
            # A session the server ended cannot restore: the error in flight is the one
            # to raise (and a connection Django closes comes back with the server's value).
            with suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute(restore)
            raise
        with connection.cursor() as cursor:
            cursor.execute(restore)

    def _send(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """Send each lane's rows, in order; returns the rows of the lanes that failed (or
        were held back meanwhile), which must stay in the table."""
        by_lane: dict[Lane, list[OutboxRow]] = {}
        for row in rows:
            by_lane.setdefault(lane_of(row.queue, row.message_id), []).append(row)
        held: list[OutboxRow] = []
        batches: dict[Lane, list[NewMessage]] = {}
        for lane, group in by_lane.items():
            if self._lanes.is_held(lane):
                held += group
                continue
            batches[lane] = [row.message() for row in group]
        for lane, outcome in self._call_lanes(batches).items():
            if isinstance(outcome, Exception):
                # Whatever Redis took of this lane's call is noted in its relayed set: the
                # rows relayed again later write nothing twice.
                self._hold(lane, outcome)
                held += by_lane[lane]
                continue
            written = sum(due is not None for due in outcome)
            self.relayed += written
            self.repeated += len(outcome) - written
        return held

    def _put_back(self, alias: str, rows: list[OutboxRow]) -> None:
        """Write the rows of failed lanes again, with their keys (so their order), in the
        transaction that took them: to every other relay they never left."""
        from delayqueue_django.outbox.models import OutboxMessage

        OutboxMessage.objects.using(alias).bulk_create(
            [
                OutboxMessage(id=row.pk, **{name: getattr(row, name) for name in ROW_FIELDS[1:]})
                for row in rows
            ]
        )

    def _call_lanes(
        self, batches: dict[Lane, list[NewMessage]]
    ) -> dict[Lane, list[int | None] | Exception]:
        """Each lane's relay call, with the ids to forget that wait for it, all at once;
        each lane's due times, or its error (a lane silent for lane_patience_seconds: a
        TimeoutError). The ids to forget of a lane that failed wait for its next call."""
        started = {}
        for lane, messages in batches.items():
            forget = self._forget.pop(lane, [])
            store = self.queues[lane[0]].store
            call = functools.partial(store.relay, messages, forget=forget, keep_ms=RELAY_RECORD_MS)
            started[lane] = (forget, start_call(call))
        deadline = time.monotonic() + self.lane_patience_seconds
        outcomes: dict[Lane, list[int | None] | Exception] = {}
        for lane, (forget, future) in started.items():
            try:
                outcomes[lane] = future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                outcomes[lane] = RedisTimeoutError(
                    f"{describe(lane)}: no answer within {self.lane_patience_seconds:g} s"
                )
            except Exception as error:
                outcomes[lane] = error
            if isinstance(outcomes[lane], Exception):
                kept = forget + self._forget.get(lane, [])
                self._forget[lane] = kept[-PENDING_FORGET_LIMIT:]
        return outcomes

    def _hold(self, lane: Lane, error: Exception) -> None:
        """Hold back a lane that failed and, when its server hangs or cannot be reached,
        the queue's other shards on that server: each would cost a batch its own wait."""
        self._lanes.failed(lane, error)
        store = self.queues[lane[0]].store
        if isinstance(error, (RedisTimeoutError, RedisConnectionError)) and isinstance(
            store, ShardedStore
        ):
            for shard in store.on_same_server(lane[1]):
                self._lanes.failed((lane[0], shard), error)

    def _probe(self, lane: Lane) -> None:
        """Whether a held lane's Redis answers: the relay script on its shard alone, with
        an id to forget that no message has (the call with nothing at all goes to every
        shard)."""
        queue, shard = lane
        suffix = "" if shard == "0" else f"{SHARD_MARK}{shard}"
        self.queues[queue].store.relay([], forget=[f"relay-probe{suffix}"], keep_ms=RELAY_RECORD_MS)

    def forget_relayed(self) -> None:
        """Tell Redis the ids whose rows were deleted since the last batch (done by the next
        batch otherwise). A lane whose Redis fails is held back; its ids wait."""
        waiting: dict[Lane, list[NewMessage]] = {
            lane: [] for lane in self._forget if not self._lanes.is_held(lane)
        }
        for lane, outcome in self._call_lanes(waiting).items():
            if isinstance(outcome, Exception):
                self._hold(lane, outcome)

    def has_rows(self, alias: str) -> bool:
        """Whether our queues have rows on ``alias`` (but for the held lanes'): a plain
        read, no lock taken. Its SQL is built once for each set of lanes held: a poll
        runs every RELAY_POLL_SECONDS in every worker, and building the ORM's query took
        nine tenths of its CPU."""
        held = self._lanes.held()
        look = self._looks.get((alias, *held))
        if look is None:
            look = self._look(alias)
            if self._lanes.held() == held:  # else built for other lanes: not kept
                self._looks = {**self._looks, (alias, *held): look}
        with connections[alias].cursor() as cursor:
            cursor.execute(*look)
            return cursor.fetchone() is not None

    def _look(self, alias: str) -> tuple[str, tuple[Any, ...]]:
        """The SQL of has_rows and its parameters: the id of one row of our queues, but
        for the held lanes'."""
        from delayqueue_django.outbox.models import OutboxMessage

        names = list(self.queues)
        rows = OutboxMessage.objects.using(alias).filter(self._lanes.q(names), queue__in=names)
        sql, params = rows.values_list("pk")[:1].query.get_compiler(using=alias).as_sql()
        return sql, tuple(params)

    def raise_held(self) -> None:
        """Raise the error of a lane held back, if any (a drain's caller learns of it)."""
        error = self._lanes.first_error()
        if error is not None:
            raise error

    # Running

    def drain(self) -> int:
        """Relay until no row of our queues is left (those committed meanwhile included);
        returns how many rows were taken. A lane whose Redis fails is tried once: its rows
        stay, and its error is raised once the other lanes' rows are relayed. Database
        errors propagate.

        A short batch does not prove the outbox empty: rows another relay holds are skipped,
        and on MySQL/MariaDB so is a row that another transaction's range read merely
        locked on its way. So it ends when a plain read finds no row, and while rows are
        held elsewhere it waits for them a little.
        """
        total = 0
        self._lanes.forget_all()
        for alias in self.databases:
            while True:
                taken = self.relay_batch(alias)
                total += taken
                if taken >= self.batch_size:
                    continue
                if not self.has_rows(alias):
                    break
                if not taken:
                    time.sleep(DRAIN_WAIT_SECONDS)
        self.forget_relayed()
        self.raise_held()
        return total

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self, *, every: Sequence[tuple[float, Callable[[], object]]] = ()) -> None:
        """Relay until ``stop()``: at once after a commit in this process that wrote outbox
        rows, else every ``poll_seconds``; a database or Redis that fails is retried with
        backoff while the others go on. ``every``: (seconds, step) pairs run on their own
        schedule in this thread (the worker prunes processed ids with it)."""
        backoffs = {alias: Backoff(first=0.2) for alias in self.databases}
        retry_at = dict.fromkeys(self.databases, 0.0)
        schedule = [_Scheduled(seconds, step) for seconds, step in every]
        woken = True
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                busy = False
                for alias in self.databases:
                    if time.monotonic() < retry_at[alias]:
                        continue
                    try:
                        # A poll looks first, with a plain read: no lock, no transaction.
                        if woken or self.has_rows(alias):
                            busy |= self.relay_batch(alias) >= self.batch_size
                        backoffs[alias].reset()
                    except Exception as error:
                        wait = self._failed(alias, error, backoffs[alias])
                        retry_at[alias] = time.monotonic() + wait
                if not busy and self._forget:
                    self.forget_relayed()
                self._lanes.probe_due(self._probe)
                for entry in schedule:
                    if time.monotonic() >= entry.next_at:
                        entry.next_at = time.monotonic() + entry.seconds
                        self._run_step(entry.step)
                if busy:
                    woken = True
                    continue
                now = time.monotonic()
                wait = min(
                    [self.poll_seconds] * bool(self.databases)
                    + [at - now for at in retry_at.values() if at > now]
                    + [entry.next_at - now for entry in schedule]
                    + [at - now for at in [self._lanes.next_probe_at()] if at is not None],
                    default=self.poll_seconds,
                )
                woken = self._wake.wait(max(wait, 0.0))
        finally:
            self.forget_relayed()
            connections.close_all()

    def _failed(self, alias: str, error: Exception, backoff: Backoff) -> float:
        """Log a failed look at ``alias``; returns how long to wait before the next."""
        if isinstance(error, RedisError):
            logger.warning(
                "outbox relay: Redis unavailable, rows on database %s wait: %s", alias, error
            )
            return backoff.next()
        # A broken connection is opened anew on the next try.
        with suppress(DatabaseError):
            connections[alias].close()
        if not isinstance(error, DatabaseError):
            logger.error("outbox relay: unexpected error on database %s", alias, exc_info=error)
            return backoff.next()
        if not self._table_exists(alias):
            # A site that has not migrated yet (check W030 says so too): no row can wait
            # there, so look again only now and then, without a warning each time.
            if alias not in self._missing_tables:
                self._missing_tables.add(alias)
                logger.warning(
                    "outbox relay: database %s has no outbox table (python manage.py migrate "
                    "delayqueue_django --database %s); looking again every %.0f s",
                    alias,
                    alias,
                    MISSING_TABLE_SECONDS,
                )
            return MISSING_TABLE_SECONDS
        logger.warning("outbox relay: database %s failed: %s", alias, error)
        return backoff.next()

    def _table_exists(self, alias: str) -> bool:
        from delayqueue_django.outbox.models import OutboxMessage

        try:
            with connections[alias].cursor() as cursor:
                tables = connections[alias].introspection.table_names(cursor)
        except DatabaseError:
            return True  # the database itself is away: a failure like any other
        return OutboxMessage._meta.db_table in tables

    def _run_step(self, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:
            logger.exception("outbox relay thread: %r failed; trying again later", step)
            # A connection the step broke (a database restarted) is opened anew next time,
            # as _failed does for the relay's own: this thread is not a request's, nothing
            # else would close it, and the step would fail on it for good.
            for connection in connections.all(initialized_only=True):
                with suppress(DatabaseError):
                    connection.close_if_unusable_or_obsolete()
