"""Throughput under ``kill -9``: how fast three outbox relays move rows to Redis, and three
EXACTLY_ONCE workers handle messages, while one of their processes is killed every
``KILL_EVERY`` seconds (and replaced); the same with no kills, for comparison.

The shapes are those of the chaos scenarios whose windows follow these paces
(tests/chaos/test_outbox_faults.py): relays in batches of 20, workers with ``--concurrency 4``
and a 3-second lease. They run as real ``manage.py`` processes on the outbox benchmark's
database (benchmarks/outbox.py). A pace is measured from the moment every process has started
until the backlog, made at once then (one commit, one send_many), is empty.
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from benchmarks.report import Row

KILL_EVERY = 0.5  # seconds between two kills
PROCESSES = 3
LEASE_SECONDS = 3  # MAX_CONSUME_DURATION: a killed worker's messages come back after it
RELAY_ARGS = ("--batch-size", "20", "--poll", "0.05")
BANNER = "queue 'default'"  # printed by a started worker or relay (-v 1)
NOOP = "benchmarks.handlers.noop"


class Processes:
    """``PROCESSES`` ``manage.py <command>`` processes that can be killed and replaced."""

    def __init__(self, command: list[str], environment: dict[str, str]) -> None:
        self.command, self.environment = command, environment
        self.running: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        self.kills = 0

    def __enter__(self) -> "Processes":
        while len(self.running) < PROCESSES:
            self.running.append(self._spawn())
        return self

    def __exit__(self, *exc_info: object) -> None:
        for process, _ in self.running:
            process.send_signal(signal.SIGTERM)
        for process, log in self.running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()

    def _spawn(self) -> tuple["subprocess.Popen[bytes]", IO[bytes]]:
        log = tempfile.TemporaryFile()  # noqa: SIM115  (closed with its process)
        process = subprocess.Popen(
            [sys.executable, "-m", "django", *self.command, "-v", "1"],
            env=self.environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return process, log

    @staticmethod
    def _started(entry: tuple["subprocess.Popen[bytes]", IO[bytes]]) -> bool:
        process, log = entry
        if process.poll() is not None:
            log.seek(0)
            output = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}:\n{output}")
        log.seek(0)
        return BANNER in log.read().decode(errors="replace")

    def wait_started(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not all(map(self._started, self.running)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.command} did not start within {timeout} s")
            time.sleep(0.05)

    def kill_one(self, rng: random.Random) -> None:
        """``kill -9`` a started process, chosen at random, and start one in its place."""
        started = [entry for entry in self.running if self._started(entry)]
        if not started:
            return
        victim = rng.choice(started)
        self.running.remove(victim)
        victim[0].send_signal(signal.SIGKILL)
        victim[0].wait()
        victim[1].close()
        self.kills += 1
        self.running.append(self._spawn())


@dataclass(frozen=True)
class Pace:
    rate: float  # backlog items per second
    kills: int


def pace(
    processes: Processes,
    fill: Callable[[], None],
    backlog: Callable[[], int],
    kills: bool,
    timeout: float,
) -> Pace:
    """Once every process has started, ``fill()`` makes the backlog at once (one commit, one
    call): how fast ``backlog()`` then falls to 0, with a kill every ``KILL_EVERY`` seconds
    when ``kills``."""
    rng = random.Random(7)
    processes.wait_started()
    fill()
    started = time.monotonic()
    first = left = backlog()
    next_kill = started + KILL_EVERY
    while left:
        now = time.monotonic()
        if now - started > timeout:
            raise RuntimeError(f"{left} of {first} left after {timeout} s")
        if kills and now >= next_kill:
            processes.kill_one(rng)
            next_kill = now + KILL_EVERY
        time.sleep(0.02)
        left = backlog()
    return Pace(first / (time.monotonic() - started), processes.kills)


def environment(redis_url: str, database: dict[str, Any], queue: dict[str, Any]) -> dict[str, str]:
    """The processes' environment: the benchmark's settings, its Redis and database, and
    these options for the default queue."""
    from benchmarks.workers import ROOT

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
        "DQ_BENCH_REDIS_URL": redis_url,
        "DQ_BENCH_HANDLER": NOOP,
        "DQ_BENCH_DATABASE": json.dumps(database),
        "DQ_BENCH_QUEUE": json.dumps(queue),
        "PYTHONPATH": str(ROOT),
    }


def relay_pace(count: int, redis_url: str, kills: bool) -> Pace:
    """``count`` outbox rows (committed first), moved to Redis by three relays."""
    from django.conf import settings
    from django.db import transaction

    from delayqueue_django import get_queue
    from delayqueue_django.models import OutboxMessage

    queue = get_queue()

    def fill() -> None:
        with transaction.atomic():
            for start in range(0, count, 1000):
                batch = [{"n": n} for n in range(start, min(start + 1000, count))]
                queue.send_many(batch, delay=3600, outbox=True)

    env = environment(redis_url, settings.DATABASES["default"], {})
    with Processes(["delayqueue_relay", *RELAY_ARGS], env) as relays:
        return pace(relays, fill, OutboxMessage.objects.count, kills, timeout=600)


def exactly_once_pace(count: int, redis_url: str, kills: bool, concurrency: int) -> Pace:
    """``count`` messages due now, handled (a handler doing nothing, in the transaction that
    records the message) by three EXACTLY_ONCE workers."""
    from django.conf import settings

    from delayqueue_django import get_queue

    queue = get_queue()
    options = {"EXACTLY_ONCE": True, "MAX_CONSUME_DURATION": LEASE_SECONDS}
    env = environment(redis_url, settings.DATABASES["default"], options)

    def waiting() -> int:
        stats = queue.stats()
        return sum(stats[state] for state in ("pending", "ready", "unack", "retry"))

    def fill() -> None:
        queue.send_many([{"n": n} for n in range(count)])

    command = ["run_delayqueue", "--concurrency", str(concurrency), "--no-relay"]
    with Processes(command, env) as workers:
        return pace(workers, fill, waiting, kills, timeout=600)


def concurrency(kind: str) -> int:
    """4 threads a worker, as in the chaos scenario; 1 on SQLite, which locks the whole
    database for each writer (EXACTLY_ONCE's threads would fail on "database is locked")."""
    return 1 if kind == "SQLite" else 4


def rows(
    args: Any, kind: str, relays: dict[bool, list[Pace]], workers: dict[bool, list[Pace]]
) -> list[Row]:
    every = f"one kill -9 every {KILL_EVERY:g} s"
    threads = concurrency(kind)
    relay = (
        f"outbox relay, {PROCESSES} relays (batches of 20), {args.kill_messages:,} rows ({kind})"
    )
    handled = (
        f"EXACTLY_ONCE, {PROCESSES} workers (--concurrency {threads}, handler doing nothing), "
        f"{args.kill_messages:,} messages ({kind})"
    )
    return [
        Row(f"{relay}: no kills", [p.rate for p in relays[False]], "msg/s", ""),
        Row(
            f"{relay}: {every} (median {_kills(relays[True])} kills)",
            [p.rate for p in relays[True]],
            "msg/s",
            "",
        ),
        Row(f"{handled}: no kills", [p.rate for p in workers[False]], "msg/s", ""),
        Row(
            f"{handled}: {every}, a {LEASE_SECONDS} s lease (median {_kills(workers[True])} kills)",
            [p.rate for p in workers[True]],
            "msg/s",
            "",
        ),
    ]


def _kills(paces: list[Pace]) -> int:
    return sorted(p.kills for p in paces)[len(paces) // 2]
