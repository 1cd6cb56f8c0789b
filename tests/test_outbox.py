"""The transactional outbox and its relay, on SQLite, PostgreSQL and MariaDB."""

import asyncio
import threading
import time
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from redis.exceptions import ConnectionError as RedisConnectionError

import delayqueue_django as delayqueue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.exceptions import ConflictingOptions, QueueConfigurationError
from delayqueue_django.outbox.models import OutboxMessage
from delayqueue_django.outbox.relay import RELAY_RECORD_MS, OutboxRelay
from delayqueue_django.outbox.table import now_ms
from delayqueue_django.worker import Worker
from tests.helpers import short_lock_waits, wait_for
from tests.redis_servers import RedisServer


def rows(alias: str) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.using(alias).order_by("id"))


def relay_for(alias: str, *names: str, **options: Any) -> OutboxRelay:
    queues = [delayqueue.get_queue(name) for name in names or ("default",)]
    return OutboxRelay(queues, databases=[alias], **options)


def test_a_message_exists_exactly_when_its_transaction_commits(database: str) -> None:
    queue = delayqueue.get_queue()
    with transaction.atomic(using=database):
        kept = queue.send({"order": 1}, delay=60, outbox=True, using=database)
        assert [row.message_id for row in rows(database)] == [kept]
    with transaction.atomic(using=database):
        queue.send_many([{"order": 2}, {"order": 3}], outbox=True, using=database)
        transaction.set_rollback(True, using=database)
    assert queue.stats()["pending"] == 0  # nothing in Redis before a relay ran

    relay = relay_for(database)
    assert relay.drain() == 1
    assert rows(database) == []
    [pending] = queue.list_messages("pending")
    assert pending.id == kept
    assert queue.peek(kept).payload == '{"order":1}'  # type: ignore[union-attr]
    assert (relay.relayed, relay.repeated) == (1, 0)


def test_the_row_keeps_the_message_as_sent(database: str) -> None:
    queue = delayqueue.get_queue()
    before = now_ms()
    message_id = queue.send({"x": [1, "é"]}, delay=2.5, retry_count=7, outbox=True, using=database)
    after = now_ms()
    [row] = rows(database)
    assert (row.queue, row.message_id, row.payload) == ("default", message_id, '{"x":[1,"é"]}')
    assert row.retry_count == 7
    # Due 2.5 s after the send, on the clock of the process that wrote the row.
    assert before + 2500 <= row.due_ms <= after + 2501
    assert before <= row.written_ms <= after


def test_the_due_time_is_fixed_when_the_row_is_written(database: str) -> None:
    """A relay that comes late does not make the message later: its due time counts from the
    send, and one already past is due at once."""
    queue = delayqueue.get_queue()
    later = queue.send("later", delay=30, outbox=True, using=database)
    overdue = queue.send("overdue", delay=0.2, outbox=True, using=database)
    due_later, due_overdue = (row.due_ms for row in rows(database))
    time.sleep(0.5)  # the relay comes late
    relay_started = queue.stats()["server_time_ms"]
    relay_for(database).drain()
    assert queue.peek(later).score_ms == due_later  # type: ignore[union-attr]
    assert due_later > relay_started + 29_000
    # Due 0.2 s after the send, relayed 0.5 s after it: due at once, from the relay on.
    [message] = queue.fetch(10).messages
    assert message.id == overdue
    assert due_overdue < relay_started <= message.due_ms <= queue.stats()["server_time_ms"]


def test_a_row_relayed_again_after_its_message_was_handled_is_not_sent_again(
    database: str,
) -> None:
    """The relay died after Redis accepted its batch, before its delete committed: the row
    is relayed again, after a worker handled and acked the message."""
    queue = delayqueue.get_queue()
    message_id = queue.send("once", outbox=True, using=database)
    [row] = rows(database)
    # What the dead relay got done: Redis accepted the message...
    queue.store.relay(
        [NewMessage(row.message_id, row.payload, row.retry_count, at_ms=row.due_ms)],
        forget=[],
        keep_ms=RELAY_RECORD_MS,
    )
    # ...which was then handled and acked: the queue no longer knows it.
    [message] = queue.fetch(10).messages
    assert queue.ack([message]) == {message_id}
    assert queue.peek(message_id) is None

    relay = relay_for(database)
    assert relay.drain() == 1
    assert (relay.relayed, relay.repeated) == (0, 1)
    assert rows(database) == []
    assert queue.peek(message_id) is None
    assert queue.stats()["pending"] == 0


def test_redis_down_rows_wait_and_are_relayed_once_it_is_back(database: str, settings: Any) -> None:
    server = RedisServer()
    try:
        settings.DELAYQUEUES = {
            "default": {"URL": server.url, "OPTIONS": {"socket_timeout": 2, "retry": None}}
        }
        queue = delayqueue.get_queue()
        relay = relay_for(database)
        assert relay.drain() == 0  # connected and scripts loaded while Redis was up
        server.stop()
        ids = queue.send_many(["a", "b", "c"], outbox=True, using=database)
        with pytest.raises(RedisConnectionError):
            relay.drain()
        assert [row.message_id for row in rows(database)] == ids  # rolled back: they wait
        server.start()
        assert relay.drain() == 3
        assert sorted(m.id for m in queue.list_messages("pending")) == sorted(ids)
        assert rows(database) == []
    finally:
        server.close()


def test_relays_racing_never_send_a_row_twice(database: str) -> None:
    queue = delayqueue.get_queue()
    ids = queue.send_many(list(range(600)), outbox=True, using=database)
    relays = [relay_for(database, batch_size=50) for _ in range(4)]
    errors: list[BaseException] = []

    def drain(relay: OutboxRelay) -> None:
        try:
            relay.drain()
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()  # this thread's own: the test database is dropped later

    threads = [threading.Thread(target=drain, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    # Each row taken by one relay only: none was even offered to Redis twice.
    assert sum(relay.relayed for relay in relays) == 600
    assert sum(relay.repeated for relay in relays) == 0
    assert sorted(m.id for m in queue.list_messages("pending", limit=1000)) == sorted(ids)
    assert rows(database) == []


def test_a_relay_never_waits_for_the_rows_another_relay_holds(row_locking_database: str) -> None:
    """Regression: on MariaDB a young table's statistics made the planner scan the whole
    table for a batch's DELETE, FORCE INDEX or not; the scan waited for the rows another
    relay held while Redis answered it, and relays racing deadlocked."""
    alias = row_locking_database
    queue = delayqueue.get_queue()
    queue.send_many(list(range(100)), outbox=True, using=alias)
    holding, release = threading.Event(), threading.Event()

    class HoldingRelay(OutboxRelay):
        def _send(self, rows: list[Any]) -> list[Any]:
            holding.set()  # the batch is taken and deleted, the transaction still open
            release.wait(30)
            return super()._send(rows)

    first = HoldingRelay([queue], databases=[alias], batch_size=50)

    def relay_held_batch() -> None:
        try:
            first.relay_batch(alias)
        finally:
            connections.close_all()

    thread = threading.Thread(target=relay_held_batch)
    thread.start()
    try:
        assert holding.wait(10)
        short_lock_waits(alias)
        second = relay_for(alias, batch_size=50)
        assert second.relay_batch(alias) == 50
    finally:
        release.set()
        thread.join(30)
    assert (first.relayed, second.relayed) == (50, 50)
    assert rows(alias) == []


def test_a_relay_stuck_mid_batch_frees_its_rows_after_the_idle_limit(
    row_locking_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a relay that stopped mid-batch (its host gone, Redis hung) held its rows
    until the server noticed the dead connection (PostgreSQL: about 2 h of keepalive;
    MariaDB: wait_timeout, 8 h), and every other relay skipped them meanwhile. The server
    now ends its session after the relay's idle limit."""
    alias = row_locking_database
    queue = delayqueue.get_queue()
    ids = queue.send_many(list(range(10)), outbox=True, using=alias)
    holding, release = threading.Event(), threading.Event()

    class StuckRelay(OutboxRelay):
        def _send(self, rows: list[Any]) -> list[Any]:
            holding.set()  # rows taken, the transaction open and idle, as while Redis hangs
            release.wait(30)
            return super()._send(rows)

    first = StuckRelay([queue], databases=[alias], idle_limit_seconds=1, poll_seconds=0.05)
    thread = threading.Thread(target=first.run)
    thread.start()
    try:
        assert holding.wait(10)
        second = relay_for(alias)
        assert second.relay_batch(alias) == 0  # held by the stuck relay
        started = time.monotonic()
        wait_for(lambda: second.relay_batch(alias), timeout=10, what="the rows freed")
        assert time.monotonic() - started < 5
        # The stuck relay's Redis call goes through at last: it writes nothing twice, and
        # its commit fails on the session the server ended.
        release.set()
        wait_for(lambda: first.repeated == 10, what="the stuck relay's call")
        assert (first.relayed, second.relayed) == (0, 10)
        assert sorted(m.id for m in queue.list_messages("pending")) == sorted(ids)
        assert rows(alias) == []
        # It goes on, on a new connection.
        [later] = queue.send_many(["later"], outbox=True, using=alias)
        wait_for(lambda: first.relayed == 1, what="the next batch")
        assert queue.peek(later) is not None
    finally:
        release.set()
        first.stop()
        thread.join(30)
    assert not thread.is_alive()
    [failed] = [r.getMessage() for r in caplog.records if r.name == "delayqueue_django.relay"]
    assert f"database {alias} failed" in failed


def test_the_idle_limit_is_the_relay_transactions_alone(row_locking_database: str) -> None:
    """The connection's other uses (pruning, a caller's drain) keep the server's setting."""
    alias = row_locking_database
    connection = connections[alias]
    setting = (
        "@@session.idle_transaction_timeout"
        if connection.vendor == "mysql"
        else "current_setting('idle_in_transaction_session_timeout')"
    )

    def current() -> str:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {setting}")
            return str(cursor.fetchone()[0])

    before = current()
    delayqueue.get_queue().send_many([1, 2], outbox=True, using=alias)
    assert relay_for(alias, idle_limit_seconds=7).relay_batch(alias) == 2
    assert current() == before


def test_relayed_ids_are_forgotten_once_their_rows_are_deleted(
    database: str, redis_server: RedisServer
) -> None:
    queue = delayqueue.get_queue()
    queue.send_many([1, 2], outbox=True, using=database)
    relay = relay_for(database)
    relay.relay_batch(database)
    record = queue.store.keys.key("relayed")
    assert redis_server.client().zcard(record) == 2  # until the relay's next call
    relay.forget_relayed()
    assert redis_server.client().zcard(record) == 0


def test_outbox_and_on_commit_together_are_refused(database: str) -> None:
    with pytest.raises(ConflictingOptions, match="choose one"):
        delayqueue.send("x", outbox=True, on_commit=True, using=database)
    with pytest.raises(ConflictingOptions):
        asyncio.run(delayqueue.asend("x", outbox=True, on_commit=True, using=database))
    assert rows(database) == []


def test_the_outbox_option_makes_it_the_queue_default(database: str, settings: Any) -> None:
    settings.DELAYQUEUES = {**settings.DELAYQUEUES}
    settings.DELAYQUEUES["default"] = {**settings.DELAYQUEUES["default"], "OUTBOX": True}
    queue = delayqueue.get_queue()
    through_outbox = queue.send("a", using=database)
    direct = queue.send("b", outbox=False)
    with transaction.atomic(using=database):
        on_commit = queue.send("c", on_commit=True, using=database)
    assert [row.message_id for row in rows(database)] == [through_outbox]
    assert {m.id for m in queue.list_messages("pending")} == {direct, on_commit}


def test_a_database_no_relay_reads_is_refused(database: str, settings: Any) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = []
    with pytest.raises(QueueConfigurationError, match="DELAYQUEUE_OUTBOX_DATABASES"):
        delayqueue.send("x", outbox=True, using=database)


def test_asend_writes_the_row_in_the_thread_that_holds_the_transaction(database: str) -> None:
    queue = delayqueue.get_queue()

    async def in_view() -> str:
        return await queue.asend({"async": True}, delay=5, outbox=True, using=database)

    def in_transaction(rollback: bool) -> str:
        # Async code called from a thread that holds a transaction: asend must write there,
        # in that transaction (sync_to_async(thread_sensitive=True) goes back to it).
        with transaction.atomic(using=database):
            message_id = async_to_sync(in_view)()
            transaction.set_rollback(rollback, using=database)
        return message_id

    kept = in_transaction(rollback=False)
    in_transaction(rollback=True)
    assert [row.message_id for row in rows(database)] == [kept]
    ids = async_to_sync(queue.asend_many)(
        ["x", delayqueue.Outgoing("y", delay=3)], outbox=True, using=database
    )
    assert [row.message_id for row in rows(database)] == [kept, *ids]


def test_a_memory_queue_is_relayed_in_its_process(database: str, settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    queue = delayqueue.get_queue()
    message_id = queue.send("in memory", outbox=True, using=database)
    assert relay_for(database).drain() == 1
    assert queue.peek(message_id).state == "pending"  # type: ignore[union-attr]


def test_rows_of_queues_a_relay_does_not_serve_stay(database: str) -> None:
    delayqueue.send("mine", outbox=True, using=database)
    other = delayqueue.send("not mine", queue="other", outbox=True, using=database)
    assert relay_for(database, "default").drain() == 1
    assert [row.message_id for row in rows(database)] == [other]


def test_a_commit_in_the_workers_process_wakes_its_relay(database: str) -> None:
    """The relay polls only every 60 s here: the commit's doorbell brings the row at once."""
    queue = delayqueue.get_queue()
    handled = threading.Event()
    worker = Worker([(queue, lambda message: handled.set())], relay_poll=60)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # the relay's first look finds nothing; it then sleeps for 60 s
        with transaction.atomic(using=database):
            queue.send("wake up", outbox=True, using=database)
        assert handled.wait(20)
    finally:
        worker.request_stop()
        thread.join(30)
    assert rows(database) == []


def test_run_delayqueue_burst_relays_the_outbox_first(database: str) -> None:
    handled: list[Any] = []
    delayqueue.handler("default")(lambda message: handled.append(message.payload))
    try:
        delayqueue.send({"n": 1}, outbox=True, using=database)
        call_command("run_delayqueue", "default", burst=True, verbosity=0)
    finally:
        from delayqueue_django.core import handlers

        handlers._registered.pop("default", None)
    assert handled == [{"n": 1}]
    assert rows(database) == []


def test_the_relay_command(database: str) -> None:
    from io import StringIO

    delayqueue.get_queue().send_many(["a", "b"], outbox=True, using=database)
    out = StringIO()
    call_command("delayqueue_relay", burst=True, database=[database], stdout=out)
    assert "Relayed 2 messages (0 relayed before), 2 rows." in out.getvalue()
    assert delayqueue.get_queue().stats()["pending"] == 2


def test_the_relay_command_in_a_burst_with_redis_down_says_so_in_one_line(
    database: str, settings: Any
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"retry": None}}}
    ids = delayqueue.get_queue().send_many(["a", "b"], outbox=True, using=database)
    with pytest.raises(CommandError, match=r"^outbox relay failed, its rows wait: ") as caught:
        call_command("delayqueue_relay", burst=True, database=[database], stdout=StringIO())
    assert caught.value.returncode == 1
    assert "127.0.0.1:1" in str(caught.value)
    assert [row.message_id for row in rows(database)] == ids


def test_the_relay_command_refuses_an_unknown_database_naming_the_option() -> None:
    with pytest.raises(CommandError, match=r"--database: no database 'nope' in DATABASES"):
        call_command("delayqueue_relay", burst=True, database=["nope"], stdout=StringIO())


def test_relay_cost_one_statement_and_one_round_trip_per_batch(
    database: str, redis_server: RedisServer
) -> None:
    queue: Queue = delayqueue.get_queue()
    queue.send_many(list(range(300)), outbox=True, using=database)
    relay = relay_for(database, batch_size=1000)
    client = redis_server.client()
    # The Functions library loaded first (a fresh server's first FCALL fails, loads it and
    # calls again): the count below is a batch's own.
    queue.stats()
    client.config_resetstat()

    with CaptureQueriesContext(connections[database]) as queries:
        assert relay.relay_batch(database) == 300
    statements = [q["sql"] for q in queries.captured_queries]
    # (Not counted: MySQL/MariaDB's look for the outbox's index, once per relay and database.)
    taken = [
        sql for sql in statements if "delayqueue_outbox" in sql and "information_schema" not in sql
    ]
    # PostgreSQL and SQLite: one DELETE ... RETURNING; MariaDB: SELECT ... FOR UPDATE, DELETE.
    assert len(taken) == (2 if connections[database].vendor == "mysql" else 1), statements
    calls = client.info("commandstats")
    # One function call per SEND_BATCH_SIZE chunk (250), pipelined: one round trip.
    assert calls["cmdstat_fcall"]["calls"] == 2
