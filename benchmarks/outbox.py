"""The outbox and EXACTLY_ONCE: what a send through the outbox costs a request, how fast one
relay moves rows to Redis, and what exactly-once costs a handled message.

On PostgreSQL when this machine has one (127.0.0.1:5432, user postgres; DQ_BENCH_POSTGRES
=host:port:user to choose), in a database of this run's own, created and dropped here;
else on SQLite, in a temporary file. Everything runs in the benchmark's process.
"""

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks.report import Row, percentile

DATABASE_ENV = "DQ_BENCH_DATABASE"
POSTGRES = os.environ.get("DQ_BENCH_POSTGRES", "127.0.0.1:5432:postgres")
DELAY = 3600  # nothing falls due while a figure is measured


@contextmanager
def database() -> Iterator[str]:
    """A database of this run's own, for the benchmark's settings (``DQ_BENCH_DATABASE``,
    read when Django starts); yields its kind. Dropped on the way out."""
    host, port, user = POSTGRES.split(":")
    name = f"delayqueue_bench_{os.getpid()}"
    if _postgres_answers(host, int(port)):
        import psycopg

        with psycopg.connect(host=host, port=port, user=user, dbname="postgres") as admin:
            admin.autocommit = True
            admin.execute(f'CREATE DATABASE "{name}"')
        settings = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "HOST": host,
            "PORT": port,
            "USER": user,
            "CONN_MAX_AGE": None,
        }
        os.environ[DATABASE_ENV] = json.dumps(settings)
        try:
            yield "PostgreSQL"
        finally:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(host=host, port=port, user=user, dbname="postgres") as admin:
                admin.autocommit = True
                admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench.sqlite3")
        sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
        os.environ[DATABASE_ENV] = json.dumps(sqlite)
        yield "SQLite"


def _postgres_answers(host: str, port: int) -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@dataclass(frozen=True)
class SendLatency:
    outbox_ms: list[float]  # send(outbox=True) inside a transaction: its INSERT
    direct_ms: list[float]  # send() to Redis, for comparison


def send_latencies(count: int) -> SendLatency:
    """Each of ``count`` sends timed alone, in a transaction of its own (a request)."""
    from django.db import transaction

    import delayqueue_django

    send, clock = delayqueue_django.send, time.perf_counter
    outbox, direct = [], []
    for n in range(count):
        with transaction.atomic():
            started = clock()
            send({"order": n}, delay=DELAY, outbox=True)
            outbox.append((clock() - started) * 1000)
        started = clock()
        send({"order": n}, delay=DELAY)
        direct.append((clock() - started) * 1000)
    _empty_outbox()
    return SendLatency(outbox, direct)


def relay_rate(count: int) -> float:
    """Messages per second one relay moves from the outbox to Redis: ``count`` rows written
    first (committed), then relayed in batches of 1,000 by one OutboxRelay."""
    from delayqueue_django import get_queue
    from delayqueue_django.outbox.relay import OutboxRelay

    queue = get_queue()
    for start in range(0, count, 1000):
        queue.send_many(
            [{"order": n} for n in range(start, min(start + 1000, count))],
            delay=DELAY,
            outbox=True,
        )
    relay = OutboxRelay([queue], databases=["default"])
    started = time.perf_counter()
    taken = relay.drain()
    seconds = time.perf_counter() - started
    assert taken == count == relay.relayed, (taken, count, relay.relayed)
    return count / seconds


def exactly_once_cost_us(count: int) -> float:
    """What EXACTLY_ONCE adds to a handled message (µs): ``count`` deliveries run through the
    worker's call_handler with a handler doing nothing, with and without it; the difference
    per message is its transaction and the INSERT of the message's record."""
    from django.test import override_settings

    from delayqueue_django import get_queue
    from delayqueue_django.core.conf import raw_setting
    from delayqueue_django.worker.handling import call_handler

    def run(exactly_once: bool) -> float:
        options = {**raw_setting()["default"], "EXACTLY_ONCE": exactly_once}
        with override_settings(DELAYQUEUES={"default": options}):
            queue = get_queue()
            queue.send_many([{"n": n} for n in range(count)])
            messages: list[Any] = []
            while len(messages) < count:
                messages += queue.fetch(1000).messages
            clock = time.perf_counter
            started = clock()
            for message in messages:
                call_handler(_nothing, message, manage_connections=False)
            seconds = clock() - started
            queue.ack(messages)
        return seconds / count * 1_000_000

    return run(True) - run(False)


def _nothing(message: Any) -> None:
    """The handler: nothing, so that only what EXACTLY_ONCE adds is measured."""


def _empty_outbox() -> None:
    from delayqueue_django.outbox.models import OutboxMessage

    OutboxMessage.objects.all().delete()


def rows(
    args: Any, kind: str, runs: list[float], latency: SendLatency, cost: list[float]
) -> list[Row]:
    outbox, direct = latency.outbox_ms, latency.direct_ms
    direct_p50 = statistics.median(direct)
    sent = f"send(outbox=True) in a transaction ({kind} INSERT)"
    return [
        Row(f"{sent}: p50", [statistics.median(outbox)], "ms", "", 3),
        Row(f"{sent}: p99", [percentile(outbox, 0.99)], "ms", "", 3),
        Row("for comparison: send() to Redis, same run: p50", [direct_p50], "ms", "", 3),
        Row(
            f"outbox relay, one relay, {args.relay_messages:,} rows ({kind}, batches of 1,000)",
            runs,
            "msg/s",
            "≥ 10,000/s (PostgreSQL)",
        ),
        Row(
            f"EXACTLY_ONCE: added per handled message ({kind}: transaction and record INSERT)",
            cost,
            "µs",
            "",
            1,
        ),
    ]
