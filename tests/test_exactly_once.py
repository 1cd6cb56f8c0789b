"""EXACTLY_ONCE queues: a handler's database effects happen once per message, on SQLite,
PostgreSQL and MariaDB."""

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, close_old_connections, connections, transaction

from delayqueue_django import get_queue
from delayqueue_django.core import conf
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import QueueConfigurationError, Reject
from delayqueue_django.outbox.exactly_once import (
    PRUNE_BATCH,
    WriteLockBusy,
    call_once,
    prune,
    prune_queues,
)
from delayqueue_django.outbox.models import ProcessedMessage
from delayqueue_django.outbox.relay import OutboxRelay
from delayqueue_django.worker import Worker
from delayqueue_django.worker.handling import Verdict, call_handler
from tests.databases import database_params
from tests.helpers import short_lock_waits, wait_for
from tests.task_app.models import Effect


@pytest.fixture(params=database_params())
def database(request: pytest.FixtureRequest) -> str:
    alias: str = request.param
    return alias


@pytest.fixture
def exactly_once(database: str, settings: Any) -> Callable[..., Queue]:
    """``exactly_once(**options)``: the default queue, EXACTLY_ONCE on the database under
    test (by its alias), with these options."""
    url = settings.DELAYQUEUES["default"]["URL"]

    def configure(**options: Any) -> Queue:
        settings.DELAYQUEUES = {
            "default": {
                "URL": url,
                "EXACTLY_ONCE": database,
                "MAX_CONSUME_DURATION": 0.2,
                "NACK_REDELIVERY_DELAY": 0,
                **options,
            }
        }
        return get_queue()

    return configure


def effects(alias: str) -> list[str]:
    return list(Effect.objects.using(alias).order_by("id").values_list("message_id", flat=True))


def writer(alias: str, *, then: Any = None) -> Callable[[Message], Any]:
    """A handler that writes one row, then returns or raises ``then``."""

    def handle(message: Message) -> Any:
        Effect.objects.using(alias).create(message_id=message.id)
        if isinstance(then, BaseException):
            raise then
        return then

    return handle


def deliver(queue: Queue) -> Message:
    fetched: list[Message] = []
    deadline = time.monotonic() + 5
    while not fetched and time.monotonic() < deadline:
        fetched = queue.fetch(1).messages
        time.sleep(0.01)
    [message] = fetched
    return message


def test_a_redelivery_after_the_commit_is_acked_without_running_the_handler(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """The worker died after the handler's transaction committed, before its ack."""
    queue = exactly_once()
    message_id = queue.send({"order": 1})
    first = deliver(queue)
    assert call_handler(writer(database), first).verdict is Verdict.ACK
    # No ack: the delivery times out and the message comes back, attempt 2.
    again = deliver(queue)
    assert (again.id, again.attempt) == (message_id, 2)
    calls: list[str] = []
    outcome = call_handler(lambda message: calls.append(message.id), again)
    assert outcome.verdict is Verdict.ACK
    assert calls == []  # not run again
    assert queue.ack([again]) == {message_id}
    assert effects(database) == [message_id]
    assert ProcessedMessage.objects.using(database).filter(message_id=message_id).count() == 1


@pytest.mark.parametrize(
    ("then", "verdict"),
    [(False, Verdict.NACK), (RuntimeError("boom"), Verdict.NACK), (Reject("no"), Verdict.BURY)],
    ids=["returns-false", "raises", "rejects"],
)
def test_a_handler_that_fails_leaves_no_effect_and_runs_again(
    exactly_once: Callable[..., Queue], database: str, then: Any, verdict: Verdict
) -> None:
    queue = exactly_once()
    message_id = queue.send("x")
    message = deliver(queue)
    assert call_handler(writer(database, then=then), message).verdict is verdict
    # Its row and the processed record were rolled back together.
    assert effects(database) == []
    assert not ProcessedMessage.objects.using(database).exists()
    assert call_handler(writer(database), message).verdict is Verdict.ACK
    assert effects(database) == [message_id]


def test_a_handler_whose_transaction_is_marked_for_rollback_is_retried_not_acked(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """A handler written for autocommit catches an IntegrityError (a unique insert that lost
    a race, say) and returns: inside the EXACTLY_ONCE transaction that error marked it for
    rollback, so atomic() rolls back the handler's writes and the processed record at its
    end, silently. The message must be retried, not acked as handled."""
    queue = exactly_once()
    message_id = queue.send("x")
    message = deliver(queue)
    ProcessedMessage.objects.using(database).create(
        queue="other", message_id="taken", processed_ms=0
    )

    def catches(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        with suppress(IntegrityError):  # there already: fine in autocommit mode
            ProcessedMessage.objects.using(database).create(
                queue="other", message_id="taken", processed_ms=0
            )

    assert call_handler(catches, message).verdict is Verdict.NACK
    assert effects(database) == []
    assert not ProcessedMessage.objects.using(database).filter(queue="default").exists()
    assert call_handler(writer(database), message).verdict is Verdict.ACK
    assert effects(database) == [message_id]


def test_a_handler_that_closes_its_connection_is_retried_not_acked(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """close_old_connections() (as background code often calls it) closes a connection in
    a transaction, whose server rolls it back: atomic() ends without an error."""
    queue = exactly_once()
    queue.send("x")
    message = deliver(queue)

    def closes(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        close_old_connections()

    assert call_handler(closes, message).verdict is Verdict.NACK
    assert effects(database) == []


def test_a_handler_that_caught_an_error_aborting_its_transaction_is_retried_not_acked(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """An error from a raw cursor, caught: Django does not mark the transaction for
    rollback, but PostgreSQL aborted it, and turns its COMMIT into a ROLLBACK without an
    error. (Elsewhere the failed statement alone is undone and the rest commits.)"""
    queue = exactly_once()
    message_id = queue.send("x")
    message = deliver(queue)

    def catches(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        with suppress(DatabaseError), connections[database].cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    verdict = call_handler(catches, message).verdict
    if database == "postgresql":
        assert verdict is Verdict.NACK
        assert effects(database) == []
        assert call_handler(writer(database), message).verdict is Verdict.ACK
    else:
        assert verdict is Verdict.ACK
    assert effects(database) == [message_id]


@pytest.mark.parametrize("database", database_params(("mariadb",)))
def test_a_handler_that_caught_a_deadlock_is_retried_not_acked(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """Regression: MariaDB rolls a deadlock's victim back whole; the handler caught the error
    and returned, its later statements (none here) ran in a new transaction, and that one
    committed without the processed record or the handler's earlier write: acked, with
    nothing committed."""
    queue = exactly_once()
    message_id = queue.send("x")
    message = deliver(queue)
    first, second = (Effect.objects.using(database).create(message_id=n).pk for n in "ab")
    update = f"UPDATE {Effect._meta.db_table} SET message_id = message_id WHERE id = %s"
    handler_holds_first, other_holds_second = threading.Event(), threading.Event()
    other_errors: list[BaseException] = []

    def other() -> None:
        """Holds the second row, then waits for the first: heavier (more rows written),
        so InnoDB picks the handler's transaction as the deadlock's victim."""
        try:
            short_lock_waits(database)
            with transaction.atomic(using=database):
                for n in range(50):
                    Effect.objects.using(database).create(message_id=f"heavy{n}")
                with connections[database].cursor() as cursor:
                    cursor.execute(update, [second])
                    other_holds_second.set()
                    assert handler_holds_first.wait(10)
                    cursor.execute(update, [first])
        except BaseException as error:
            other_errors.append(error)
        finally:
            connections.close_all()

    def deadlocks(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        with connections[database].cursor() as cursor:
            cursor.execute(update, [first])
            handler_holds_first.set()
            assert other_holds_second.wait(10)
            time.sleep(0.3)  # the other transaction waits for the first row by now
            with suppress(DatabaseError):
                cursor.execute(update, [second])

    thread = threading.Thread(target=other)
    thread.start()
    short_lock_waits(database)
    try:
        verdict = call_handler(deadlocks, message).verdict
    finally:
        thread.join(30)
    assert other_errors == []
    assert verdict is Verdict.NACK
    assert message_id not in effects(database)
    assert call_handler(writer(database), message).verdict is Verdict.ACK
    assert message_id in effects(database)


def test_two_deliveries_running_at_once_run_the_handler_once(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """A handler outlived its delivery's deadline and the message was delivered again: the
    second delivery waits on the record's unique key, then finds it committed."""
    queue = exactly_once()
    queue.send("slow")
    message = deliver(queue)
    started = threading.Event()
    verdicts: list[Verdict] = []

    def slow(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        started.set()
        time.sleep(0.5)

    def run(handler: Callable[[Message], Any]) -> None:
        try:
            verdicts.append(call_handler(handler, message).verdict)
        finally:
            connections.close_all()

    first = threading.Thread(target=run, args=(slow,))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=run, args=(writer(database),))
    second.start()
    first.join(30)
    second.join(30)
    assert verdicts == [Verdict.ACK, Verdict.ACK]
    assert effects(database) == [message.id]


def test_ids_that_differ_only_in_case_are_two_messages(database: str, settings: Any) -> None:
    """MySQL/MariaDB's default collations ignore case; message ids and queue names must not."""
    settings.DELAYQUEUES = {
        "default": {"URL": settings.DELAYQUEUES["default"]["URL"], "EXACTLY_ONCE": database},
        "Default": {"URL": settings.DELAYQUEUES["default"]["URL"], "EXACTLY_ONCE": database},
    }
    messages = [
        Message(message_id, queue, None, attempt=1, retry_count=0, lease=1, deadline_ms=0, due_ms=0)
        for message_id, queue in (
            ("abcDEF", "default"),
            ("ABCdef", "default"),
            ("abcDEF", "Default"),
        )
    ]
    for message in messages:
        assert call_once(writer(database), message, database) is None
    assert effects(database) == ["abcDEF", "ABCdef", "abcDEF"]


def test_processed_records_are_pruned_after_the_retention(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    exactly_once(EXACTLY_ONCE_RETENTION=60)
    now = time.time_ns() // 1_000_000
    records = ProcessedMessage.objects.using(database)
    records.bulk_create(
        [
            ProcessedMessage(queue="default", message_id=f"old-{n}", processed_ms=now - 61_000)
            for n in range(PRUNE_BATCH + 5)
        ]
        + [ProcessedMessage(queue="default", message_id="young", processed_ms=now - 30_000)]
        + [ProcessedMessage(queue="other", message_id="elsewhere", processed_ms=now - 61_000)]
    )
    assert prune_queues(["default"]) == PRUNE_BATCH + 5  # in two statements
    assert sorted(records.values_list("message_id", flat=True)) == ["elsewhere", "young"]
    assert prune("default", database, 60_000) == 0


def test_exactly_once_option_is_checked(settings: Any) -> None:
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {"default": {"URL": url, "EXACTLY_ONCE": True}}
    assert conf.queue_configs()["default"].exactly_once == "default"
    for wrong in ("nowhere", 1, ["default"]):
        settings.DELAYQUEUES = {"default": {"URL": url, "EXACTLY_ONCE": wrong}}
        with pytest.raises(QueueConfigurationError, match=r"E032.*EXACTLY_ONCE"):
            conf.queue_configs()
    settings.DELAYQUEUES = {"default": {"URL": url, "EXACTLY_ONCE_RETENTION": 0}}
    with pytest.raises(QueueConfigurationError, match="E033"):
        conf.queue_configs()


def test_the_worker_prunes_processed_records(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    queue = exactly_once(EXACTLY_ONCE_RETENTION=60)
    old_ms = time.time_ns() // 1_000_000 - 120_000
    ProcessedMessage.objects.using(database).create(
        queue="default", message_id="old", processed_ms=old_ms
    )
    worker = Worker([(queue, writer(database))], relay=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        # Its database thread prunes at once, then once a minute.
        wait_for(
            lambda: not ProcessedMessage.objects.using(database).exists(),
            timeout=10,
            what="the old record to be pruned",
        )
    finally:
        worker.request_stop()
        thread.join(30)


@pytest.mark.parametrize("database", database_params(("postgresql",)), indirect=True)
def test_pruning_goes_on_after_its_connection_was_lost(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """The database thread prunes on a connection of its own; once that connection is lost
    (a database restart), the next round opens a new one instead of failing for good. (Here
    the thread relays nothing: no relay failure closes the connection for it.)"""
    queue = exactly_once(EXACTLY_ONCE_RETENTION=60)
    relay = OutboxRelay([queue], databases=[])
    backends: list[int] = []

    def prune_round() -> None:
        with connections[database].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            row = cursor.fetchone()
            assert row is not None
            backends.append(row[0])
        prune_queues(["default"])

    thread = threading.Thread(target=relay.run, kwargs={"every": [(0.1, prune_round)]})
    thread.start()
    try:
        wait_for(lambda: backends, timeout=5, what="a first pruning round")
        with connections[database].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [backends[-1]])
        time.sleep(0.5)  # a round or more fails on the lost connection
        old_ms = time.time_ns() // 1_000_000 - 120_000
        ProcessedMessage.objects.using(database).create(
            queue="default", message_id="old", processed_ms=old_ms
        )
        wait_for(
            lambda: not ProcessedMessage.objects.using(database).exists(),
            timeout=5,
            what="the old record to be pruned on a new connection",
        )
    finally:
        relay.stop()
        thread.join(10)


@pytest.mark.parametrize("database", database_params(("postgresql", "mariadb")), indirect=True)
def test_pruning_never_waits_for_the_record_of_a_handler_running(database: str) -> None:
    """Regression: on MariaDB the pruning DELETE (``WHERE id IN (...)``) was planned as a
    scan of the young table, and waited for the uncommitted record of a handler running
    meanwhile (up to innodb_lock_wait_timeout, holding up the relay thread that prunes),
    then failed."""
    now = time.time_ns() // 1_000_000
    ProcessedMessage.objects.using(database).bulk_create(
        [
            ProcessedMessage(queue="default", message_id=f"{age}-{n}", processed_ms=now - age)
            for age in (600_000, 0)
            for n in range(50)
        ]
    )
    running, done = threading.Event(), threading.Event()

    def handler_transaction() -> None:
        try:
            with transaction.atomic(using=database):
                ProcessedMessage.objects.using(database).create(
                    queue="default", message_id="running", processed_ms=now
                )
                running.set()
                done.wait(20)
        finally:
            connections.close_all()

    thread = threading.Thread(target=handler_transaction)
    thread.start()
    try:
        assert running.wait(10)
        short_lock_waits(database)
        assert prune("default", database, 60_000) == 50
    finally:
        done.set()
        thread.join(30)


def _short_busy_timeout(database: str, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """SQLite's busy timeout (Python's default is 5 s) made short, for the connections every
    thread opens from now on (they share the alias's settings)."""
    monkeypatch.setitem(connections[database].settings_dict["OPTIONS"], "timeout", seconds)
    connections[database].close()


def _holding_the_write_lock(database: str, held: threading.Event, release: threading.Event) -> None:
    """Another writer's transaction: takes SQLite's write lock, holds it until ``release``."""
    try:
        with transaction.atomic(using=database):
            Effect.objects.using(database).create(message_id="other writer")
            held.set()
            assert release.wait(30)
    finally:
        connections.close_all()


@pytest.mark.parametrize("database", database_params(("default",)), indirect=True)
def test_on_sqlite_a_handler_waits_for_another_writer_past_the_busy_timeout(
    exactly_once: Callable[..., Queue], database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue #25, defect 9): SQLite has one writer at a time. The record's
    INSERT, the transaction's first write, waited for another handler's transaction only
    SQLite's busy timeout (5 s), then failed with "database is locked": the delivery used an
    attempt, and with --concurrency 4 and 2 s handlers messages became dead letters. The
    handler had not started, so the INSERT is tried again."""
    _short_busy_timeout(database, monkeypatch, 0.05)
    queue = exactly_once(MAX_CONSUME_DURATION=20)
    message_id = queue.send("x")
    message = deliver(queue)
    held, release = threading.Event(), threading.Event()
    other = threading.Thread(target=_holding_the_write_lock, args=(database, held, release))
    other.start()
    tries: list[float] = []

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "delayqueue_processed" in sql and sql.lstrip().upper().startswith("INSERT"):
            tries.append(time.monotonic())
            if len(tries) == 4:  # three busy timeouts waited out: let the other writer go
                release.set()
        return execute(sql, params, many, context)

    try:
        assert held.wait(10)
        with connections[database].execute_wrapper(counting):
            outcome = call_handler(writer(database), message, manage_connections=False)
    finally:
        release.set()
        other.join(30)
    assert outcome.verdict is Verdict.ACK, outcome.error
    assert effects(database) == ["other writer", message_id]
    assert len(tries) >= 4


@pytest.mark.parametrize("database", database_params(("default",)), indirect=True)
def test_on_sqlite_a_handler_that_never_gets_the_write_lock_is_handed_back(
    exactly_once: Callable[..., Queue], database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait ends at half of MAX_CONSUME_DURATION, leaving the handler the other half:
    the handler never started, so its message is handed back without using an attempt."""
    _short_busy_timeout(database, monkeypatch, 0.05)
    queue = exactly_once(MAX_CONSUME_DURATION=0.5)
    queue.send("x")
    message = deliver(queue)
    held, release = threading.Event(), threading.Event()
    other = threading.Thread(target=_holding_the_write_lock, args=(database, held, release))
    other.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        outcome = call_handler(writer(database), message, manage_connections=False)
        waited = time.monotonic() - started
    finally:
        release.set()
        other.join(30)
    assert outcome.verdict is Verdict.RELEASE
    assert isinstance(outcome.error, WriteLockBusy)
    assert "database is locked" in str(outcome.error.__cause__)
    assert 0.25 <= waited < 5
    assert effects(database) == ["other writer"]


@pytest.mark.parametrize("database", database_params(("default",)), indirect=True)
def test_on_sqlite_a_worker_of_several_threads_handles_every_message_once(
    exactly_once: Callable[..., Queue], database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's case, scaled down: four threads whose handlers hold the write lock
    longer than the busy timeout; no retries, so a lock error would make a dead letter."""
    _short_busy_timeout(database, monkeypatch, 0.05)
    queue = exactly_once(MAX_CONSUME_DURATION=30, RETRY_COUNT=0)
    sent = queue.send_many([{"n": n} for n in range(8)])

    def slow_writer(message: Message) -> None:
        Effect.objects.using(database).create(message_id=message.id)
        time.sleep(0.15)  # in its transaction: three busy timeouts

    worker = Worker([(queue, slow_writer)], concurrency=4, burst=True, relay=False)
    worker.run()
    assert sorted(effects(database)) == sorted(sent)
    assert queue.stats()["garbage"] == 0


def test_a_dead_letter_requeued_past_the_retention_finds_its_record(
    exactly_once: Callable[..., Queue], database: str
) -> None:
    """Regression (issue #25, defect 8): a message whose handler committed and whose worker
    died before the ack, on its last attempt, becomes a dead letter. Its processed record
    was pruned after EXACTLY_ONCE_RETENTION while the dead letter lived on (GARBAGE_RETENTION
    longer); requeued, it ran its handler again: two rows."""
    queue = exactly_once(EXACTLY_ONCE_RETENTION=60, GARBAGE_RETENTION=None, RETRY_COUNT=0)
    message_id = queue.send("x")
    first = deliver(queue)
    assert call_handler(writer(database), first).verdict is Verdict.ACK  # and never acked
    wait_for(
        lambda: queue.fetch(1).messages == [] and queue.stats()["garbage"] == 1,
        what="the delivery to time out into a dead letter",
    )
    records = ProcessedMessage.objects.using(database).filter(message_id=message_id)
    records.update(processed_ms=time.time_ns() // 1_000_000 - 120_000)  # past the retention

    assert prune_queues(["default"]) == 0
    assert records.exists()
    assert queue.requeue([message_id]) == [message_id]
    again = deliver(queue)
    assert call_handler(writer(database), again).verdict is Verdict.ACK
    assert effects(database) == [message_id]
    assert queue.ack([again]) == {message_id}
    # Its message gone, the record goes at the next round.
    assert prune_queues(["default"]) == 1
    assert not records.exists()
