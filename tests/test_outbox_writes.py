"""Writing outbox rows: without Redis (a Redis Cluster whose seed master hangs), in chunks
a database server accepts (send_many of many large messages), and read by the relay
through an index (rows of other queues waiting)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.test.utils import CaptureQueriesContext

import delayqueue_django as delayqueue
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.sharding.placement import SHARD_MARK, shard_of
from delayqueue_django.outbox import queue_index
from delayqueue_django.outbox.models import OUTBOX_QUEUE_INDEX, OutboxMessage
from delayqueue_django.outbox.relay import OutboxRelay
from delayqueue_django.outbox.table import ROW_BYTES, chunks_of
from tests.databases import database_params, subprocess_settings
from tests.redis_servers import RedisClusterServers, RedisServer

ROOT = Path(__file__).resolve().parent.parent

# What a web process does: one order's transaction sending through the outbox.
SEND_IN_A_FRESH_PROCESS = """
import django, json
django.setup()
from django.db import transaction
import delayqueue_django as delayqueue
with transaction.atomic():
    ids = delayqueue.get_queue().send_many([{"order": n} for n in range(20)], outbox=True)
print(json.dumps(ids))
"""


def run_settings(alias: str, queues: dict[str, Any]) -> dict[str, str]:
    """The environment of a process using ``queues`` and the test database ``alias``."""
    config = {
        "DELAYQUEUES": queues,
        "DATABASES": subprocess_settings(alias),
        "DELAYQUEUE_OUTBOX_DATABASES": ["default"],
    }
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
        "DQ_CHAOS_SETTINGS": json.dumps(config),
    }


@pytest.fixture
def paused(redis_cluster: RedisClusterServers) -> Iterator[RedisServer]:
    """The cluster's seed master (the node its URL names) stopped with SIGSTOP: it accepts
    connections and answers nothing, as a master that hangs. Resumed after the test, which
    then waits for the cluster to be whole again (the other nodes may have failed it)."""
    seed = redis_cluster.nodes[0]
    assert seed.process is not None
    seed.process.send_signal(signal.SIGSTOP)
    try:
        yield seed
    finally:
        seed.process.send_signal(signal.SIGCONT)
        for node in redis_cluster.nodes:
            client = node.client(socket_timeout=1)
            deadline = time.monotonic() + 30
            while client.cluster("info")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, f"cluster node {node.port} stays failed"
                time.sleep(0.05)
            client.close()


@pytest.mark.parametrize("shards", [1, 6])
def test_an_outbox_send_needs_no_redis_on_a_cluster_whose_seed_master_hangs(
    database: str, redis_cluster: RedisClusterServers, paused: RedisServer, shards: int
) -> None:
    """Building the queue's client would ask the paused master for the cluster's slots
    and fail after its socket timeout, rolling the caller's transaction back."""
    queues = {"default": {"URL": redis_cluster.url, "OUTBOX": True, "SHARDS": shards}}
    done = subprocess.run(
        [sys.executable, "-c", SEND_IN_A_FRESH_PROCESS],
        env=run_settings(database, queues),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sent = json.loads(done.stdout)
    written = OutboxMessage.objects.using(database).order_by("id")
    assert [row.message_id for row in written] == sent
    # Each id names a shard of the settings' layout, chosen without Redis.
    assert {shard_of(message_id)[0] for message_id in sent if SHARD_MARK in message_id} <= {shards}


# Rows of a queue no relay here serves, waiting: enough that a scan would cost what the
# index saves (the planners pick the scan for a few hundred).
OTHER_QUEUE_ROWS = 20_000
# How each database's plan reads the whole outbox table.
WHOLE_TABLE = {
    "postgresql": re.compile(r"Seq Scan on delayqueue_outbox"),
    "sqlite": re.compile(r"\bSCAN delayqueue_outbox\b"),
    # EXPLAIN's access type: ALL scans the table, index the whole of an index.
    "mysql": re.compile(r"^\d+ \| \w+ \| delayqueue_outbox \| (ALL|index) \|", re.MULTILINE),
}


def fill_with_rows_of_another_queue(alias: str, count: int, queue: str = "elsewhere") -> None:
    """``count`` rows of ``queue`` (by default one no relay here serves), and the table's
    statistics brought up to date, as they are for a backlog that built up."""
    OutboxMessage.objects.using(alias).bulk_create(
        [
            OutboxMessage(
                queue=queue,
                message_id=f"m{n}",
                payload="{}",
                retry_count=0,
                due_ms=0,
                written_ms=0,
            )
            for n in range(count)
        ],
        batch_size=2000,
    )
    connection = connections[alias]
    with connection.cursor() as cursor:
        analyze = "ANALYZE TABLE" if connection.vendor == "mysql" else "ANALYZE"
        cursor.execute(f"{analyze} {OutboxMessage._meta.db_table}")
        if connection.vendor == "mysql":
            cursor.fetchall()


def plan_of(alias: str, sql: str) -> str:
    """The database's plan of a statement, one line a row."""
    connection = connections[alias]
    explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
    with connection.cursor() as cursor:
        cursor.execute(f"{explain} {sql}")
        return "\n".join(" | ".join(map(str, row)) for row in cursor.fetchall())


def test_a_relays_poll_and_take_read_only_their_queues_rows_through_the_index(
    database: str,
) -> None:
    """A poll with no row of its queues waiting (has_rows, every 0.5 s per relay) and a
    batch's take read the outbox's (queue, id) index: before it, each scanned the table."""
    fill_with_rows_of_another_queue(database, OTHER_QUEUE_ROWS)
    relay = OutboxRelay([delayqueue.get_queue(name) for name in ("default", "other")])
    with CaptureQueriesContext(connections[database]) as statements:
        assert not relay.has_rows(database)
        assert relay.relay_batch(database) == 0
    # (On MySQL/MariaDB the relay's first batch also looks the index up: not the outbox.)
    read = [
        s["sql"]
        for s in statements.captured_queries
        if "delayqueue_outbox" in s["sql"] and "information_schema" not in s["sql"]
    ]
    assert len(read) >= 2, read
    vendor = connections[database].vendor
    for sql in read:
        plan = plan_of(database, sql)
        assert OUTBOX_QUEUE_INDEX in plan, f"{sql}\n{plan}"
        assert not WHOLE_TABLE[vendor].search(plan), f"{sql}\n{plan}"


def test_a_relays_poll_builds_its_sql_once_for_each_set_of_lanes_held(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker's relay polls each database every 0.5 s: the ORM's query, built at each
    poll, was nine tenths of its CPU (and, with a database, most of an idle worker's). Each
    poll is still one read, and sees what the ORM's would: another queue's rows are none of
    its business, a held lane's rows wait."""
    relay = OutboxRelay([delayqueue.get_queue(name) for name in ("default", "other")])
    built: list[str] = []
    look = relay._look

    def counted(alias: str) -> tuple[str, tuple[Any, ...]]:
        built.append(alias)
        return look(alias)

    monkeypatch.setattr(relay, "_look", counted)
    with CaptureQueriesContext(connections[database]) as statements:
        polls = [relay.has_rows(database) for _ in range(5)]
    assert polls == [False] * 5
    assert len(statements.captured_queries) == 5
    assert built == [database]
    fill_with_rows_of_another_queue(database, 1)
    assert not relay.has_rows(database)
    delayqueue.get_queue("other").send_many([0], outbox=True, using=database)
    assert relay.has_rows(database)
    relay._lanes.failed(("other", "0"), ConnectionError("Redis away"))
    assert [relay.has_rows(database) for _ in range(3)] == [False] * 3
    relay._lanes.forget_all()
    assert relay.has_rows(database)
    assert built == [database, database]  # the held lane's, once; then the first again


def test_a_batch_looks_the_rows_it_takes_up_by_key_however_long_the_backlog(
    database: str,
) -> None:
    """A take of 1,000 rows from a backlog of its own queue deletes them by key: PostgreSQL
    planned "id IN (the oldest 1,000)" as a hash join over a scan of the whole table, each
    batch reading every row waiting (13 ms a batch at 100,000 rows)."""
    fill_with_rows_of_another_queue(database, OTHER_QUEUE_ROWS, queue="default")
    relay = OutboxRelay([delayqueue.get_queue("default")])
    with CaptureQueriesContext(connections[database]) as statements:
        assert relay.relay_batch(database) == relay.batch_size
    taken = [s["sql"] for s in statements.captured_queries if "delayqueue_outbox" in s["sql"]]
    assert taken
    vendor = connections[database].vendor
    for sql in taken:
        plan = plan_of(database, sql)
        assert not WHOLE_TABLE[vendor].search(plan), f"{sql[:300]}\n{plan}"


def test_a_batch_takes_each_queues_oldest_rows_so_a_backlog_holds_no_queue_back(
    database: str,
) -> None:
    backlog = delayqueue.get_queue("default").send_many(
        list(range(10)), outbox=True, using=database
    )
    [late] = delayqueue.get_queue("other").send_many([0], outbox=True, using=database)
    relay = OutboxRelay([delayqueue.get_queue(name) for name in ("default", "other")], batch_size=4)
    assert relay.relay_batch(database) == 5
    left = OutboxMessage.objects.using(database).order_by("id")
    assert [row.message_id for row in left] == backlog[4:]
    assert delayqueue.get_queue("other").peek(late) is not None


# More than MariaDB's default max_allowed_packet (16 MiB) in one INSERT: 20,000 messages of
# about 1 KB, as a batch job would send them.
LARGE_BATCH = 20_000
KILOBYTE_PAYLOAD = {"text": "x" * 1000}


# MariaDB's default max_allowed_packet, the smallest of the servers': no INSERT may be
# larger, whatever the server under test accepts.
MARIADB_PACKET = 16 * 1024 * 1024


def test_send_many_of_more_than_a_packet_is_written_whole(database: str) -> None:
    """Its rows go in INSERTs a default MariaDB takes: in one, they made a 20 MB INSERT,
    which such a server refused by closing the connection."""
    with (
        CaptureQueriesContext(connections[database]) as statements,
        transaction.atomic(using=database),
    ):
        sent = delayqueue.get_queue().send_many(
            [{**KILOBYTE_PAYLOAD, "n": n} for n in range(LARGE_BATCH)],
            outbox=True,
            using=database,
        )
    inserts = [len(s["sql"].encode()) for s in statements.captured_queries if "INSERT" in s["sql"]]
    assert sum(inserts) > LARGE_BATCH * len(KILOBYTE_PAYLOAD["text"])
    assert max(inserts) < MARIADB_PACKET, inserts
    written = OutboxMessage.objects.using(database).order_by("id")
    assert list(written.values_list("message_id", flat=True)) == sent
    assert json.loads(written.last().payload)["n"] == LARGE_BATCH - 1  # type: ignore[union-attr]


@pytest.fixture
def refusing_a_payload(row_locking_database: str) -> Iterator[str]:
    """The outbox table refuses rows whose payload is the JSON text "refused" (a CHECK
    constraint, taken off after the test): a write that fails after others went in."""
    with connections[row_locking_database].cursor() as cursor:
        cursor.execute(
            "ALTER TABLE delayqueue_outbox ADD CONSTRAINT delayqueue_test_refused "
            "CHECK (payload <> '\"refused\"')"
        )
    try:
        yield row_locking_database
    finally:
        with connections[row_locking_database].cursor() as cursor:
            cursor.execute("ALTER TABLE delayqueue_outbox DROP CONSTRAINT delayqueue_test_refused")


@pytest.fixture(params=database_params(("postgresql", "mariadb")))
def row_locking_database(request: pytest.FixtureRequest, settings: Any) -> str:
    alias: str = request.param
    settings.DELAYQUEUE_OUTBOX_DATABASES = [alias]
    return alias


def test_send_many_outside_a_transaction_writes_all_of_its_chunks_or_none(
    refusing_a_payload: str,
) -> None:
    """Its rows go in several INSERTs, in one transaction of their own: the last one
    refused, none is left (a relay would otherwise send the others)."""
    messages = [KILOBYTE_PAYLOAD] * LARGE_BATCH + ["refused"]
    with pytest.raises(IntegrityError):
        delayqueue.get_queue().send_many(messages, outbox=True, using=refusing_a_payload)
    assert not OutboxMessage.objects.using(refusing_a_payload).exists()


def test_inserts_are_cut_by_the_bytes_of_their_rows_not_their_count() -> None:
    sizes = [10, 10, 500, 10, 3000, 10, 10]
    messages = [NewMessage(f"id{n}", "x" * size, 0, at_ms=0) for n, size in enumerate(sizes)]
    limit = 2 * ROW_BYTES + 600
    runs = [[len(m.payload) for m in run] for run in chunks_of(messages, limit)]
    # In order, every message once; a run over the limit only when one message is.
    assert [size for run in runs for size in run] == sizes
    assert runs == [[10, 10], [500, 10], [3000], [10, 10]]


def test_every_relay_reads_its_queues_in_one_order_whatever_order_it_was_given(
    database: str,
) -> None:
    """Relays started as ``other default`` and ``default other`` take their queues' row
    locks in the same order: in opposite orders, two relays on a MariaDB without SKIP
    LOCKED could each hold one queue's rows and wait for the other's."""
    relay = OutboxRelay([delayqueue.get_queue(name) for name in ("other", "default")])
    with CaptureQueriesContext(connections[database]) as statements:
        assert relay.relay_batch(database) == 0
    taken = " ".join(
        s["sql"] for s in statements.captured_queries if "delayqueue_outbox" in s["sql"]
    )
    assert 0 <= taken.index("'default'") < taken.index("'other'"), taken


class MeasuredPayload(str):
    """A payload that counts how often it is encoded (to be measured)."""

    encoded = 0

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        MeasuredPayload.encoded += 1
        return super().encode(encoding, errors)


def test_rows_that_fit_however_they_encode_are_not_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A send, or a send_many well under the limit, goes in one INSERT without its
    payloads encoded to count their bytes; one that may not fit is measured."""
    monkeypatch.setattr(MeasuredPayload, "encoded", 0)
    messages = [NewMessage(f"id{n}", MeasuredPayload("é" * 100), 0, at_ms=0) for n in range(3)]
    fits = 3 * (ROW_BYTES + 3 + 4 * 100)
    assert [list(run) for run in chunks_of(messages, fits)] == [messages]
    assert [list(run) for run in chunks_of(messages[:1], fits)] == [messages[:1]]
    assert MeasuredPayload.encoded == 0
    # 200 bytes each in UTF-8: all three in one run still, once measured.
    assert [list(run) for run in chunks_of(messages, fits - 1)] == [messages]
    assert MeasuredPayload.encoded == 3
    assert list(chunks_of([], fits)) == []


@contextmanager
def without_the_queue_index(alias: str) -> Iterator[None]:
    """The outbox as migration 0002 left it: without the (queue, id) index (created again
    after the block)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(f"DROP INDEX {OUTBOX_QUEUE_INDEX} ON delayqueue_outbox")
    try:
        yield
    finally:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"CREATE INDEX {OUTBOX_QUEUE_INDEX} ON delayqueue_outbox (queue, id)")


@pytest.fixture
def before_migration_0003(mariadb: str) -> Iterator[str]:
    """The MariaDB outbox as a rolling deploy's new relays find it before ``migrate``."""
    with without_the_queue_index(mariadb):
        yield mariadb


@pytest.fixture(params=database_params(("mariadb",)))
def mariadb(request: pytest.FixtureRequest, settings: Any) -> str:
    alias: str = request.param
    settings.DELAYQUEUE_OUTBOX_DATABASES = [alias]
    return alias


def test_a_relay_runs_before_migration_0003_and_says_to_apply_it(
    before_migration_0003: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Forcing the index migration 0003 creates failed every batch (error 1176) until
    ``migrate``: the relay moved nothing and only logged "database failed"."""
    alias = before_migration_0003
    queue = delayqueue.get_queue()
    sent = queue.send_many([1, 2, 3], outbox=True, using=alias)
    relay = OutboxRelay([queue, delayqueue.get_queue("other")])
    with caplog.at_level("WARNING", logger="delayqueue_django.relay"):
        assert relay.relay_batch(alias) == 3
        queue.send(4, outbox=True, using=alias)
        assert relay.relay_batch(alias) == 1
    assert all(queue.peek(message_id) is not None for message_id in sent)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert OUTBOX_QUEUE_INDEX in warnings[0]
    assert "0003" in warnings[0]
    assert f"migrate delayqueue_django --database {alias}" in warnings[0]


def test_a_relay_reads_without_the_index_when_it_is_dropped_under_it(
    mariadb: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay that found the index goes on when it is gone (a migration rolled back), and
    reads through it again once it is back."""
    queue = delayqueue.get_queue()
    relay = OutboxRelay([queue])
    assert relay.relay_batch(mariadb) == 0
    with without_the_queue_index(mariadb):
        queue.send(1, outbox=True, using=mariadb)
        with caplog.at_level("WARNING", logger="delayqueue_django.relay"):
            assert relay.relay_batch(mariadb) == 1
        assert "0003" in caplog.text
    monkeypatch.setattr(queue_index, "MISSING_INDEX_SECONDS", 0.0)
    with CaptureQueriesContext(connections[mariadb]) as statements:
        assert relay.relay_batch(mariadb) == 0
    assert any("FORCE INDEX" in s["sql"] for s in statements.captured_queries)


# A fresh process's first calls to a queue whose cluster it cannot reach: the error of each.
CALL_IN_A_FRESH_PROCESS = """
import django, json
django.setup()
import delayqueue_django as delayqueue
queue = delayqueue.get_queue()
errors = []
for call in (lambda: queue.send(1), queue.stats):
    try:
        call()
    except Exception as error:
        errors.append([type(error).__name__, str(error)])
print(json.dumps(errors))
"""


def test_a_cluster_that_cannot_be_reached_raises_queue_unavailable_naming_the_queue(
    redis_cluster: RedisClusterServers, paused: RedisServer
) -> None:
    """Building the cluster client, on the queue's first use, raised redis-py's
    RedisClusterException ("Redis Cluster cannot be connected"), naming no queue."""
    queues = {"default": {"URL": redis_cluster.url, "OPTIONS": {"socket_timeout": 0.5}}}
    done = subprocess.run(
        [sys.executable, "-c", CALL_IN_A_FRESH_PROCESS],
        env=run_settings("default", queues),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout)
    assert len(errors) == 2, errors
    for name, text in errors:
        assert name == "QueueUnavailable", errors
        assert "queue 'default'" in text, errors
        assert f"127.0.0.1:{paused.port}" in text, errors
