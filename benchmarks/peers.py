"""Peers: the trickle of benchmarks/lateness.py, on the same private Redis and measured the
same way, with huey and with celery (tasks given an eta), next to our own; and a burst
(benchmarks/send_burst.py): many messages sent one call each, then drained.

Each peer's consumer is a real subprocess started with the peer's own worker command and
its defaults (the app modules: benchmarks/peer_huey.py, benchmarks/peer_celery.py); its
task records how late it started, like our ``record_lateness`` handler. The messages are
sent with ``lateness.send_paced``, the server's usage read with ``probes.server_usage``
just before the first send and once the last message was handled and nothing is left in
the peer's own keys; the commands the benchmark sent itself (one INFO, its polls) are
taken out, as for ours.

huey and celery come with the optional ``peers`` extra (``make bench`` installs it).
"""

import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import delayqueue_django
from benchmarks import lateness, probes, send_burst
from benchmarks.lateness import Trickle
from benchmarks.report import Row, percentile
from benchmarks.send_burst import SendBurst
from benchmarks.workers import ROOT, WorkerProcesses

INSTALL = 'pip install -e ".[peers]"'
PEER_PACKAGES = ("huey", "celery")


def chosen_peers(names: str) -> list[str]:
    """The peers of ``--peers`` (comma-separated; '' for ours only)."""
    chosen = [name for name in names.split(",") if name]
    unknown = set(chosen) - set(PEER_PACKAGES)
    if unknown:
        raise SystemExit(
            f"unknown --peers {', '.join(sorted(unknown))}; choose from "
            f"{','.join(PEER_PACKAGES)} (or none: --peers '')"
        )
    return chosen


def require(names: Sequence[str] = PEER_PACKAGES) -> None:
    """Stop with a clear message when huey or celery is missing."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"the peers benchmark needs {' and '.join(missing)}, which the optional peers "
            f"extra installs: {INSTALL} (make bench does); or --peers '' to run ours only"
        )


@dataclass(frozen=True)
class Contender:
    """One queue in the comparison: how it is named in the table, how it is run (its
    defaults, for the reader), and one trickle with it."""

    name: str
    setup: str
    trickle: Callable[[int, float, Any], Trickle]  # (count, spread, probe client)
    burst: Callable[[int, Any], SendBurst]  # (count, probe client)


def contenders(redis_url: str, peers: Sequence[str] = PEER_PACKAGES) -> list[Contender]:
    """Ours, then huey, then celery (those of ``peers``): each run measures them in this
    order."""

    def ours(count: int, spread: float, probe: Any) -> Trickle:
        return lateness.with_worker(count, spread, redis_url, probe)

    def send(due_ms: int, at: datetime) -> None:
        delayqueue_django.send({"due_ms": due_ms}, at=at)

    def worker(results: Path, probe: Any) -> WorkerProcesses:
        env = {"DQ_BENCH_LATENESS_FILE": str(results)}
        return WorkerProcesses(1, redis_url, "benchmarks.handlers.record_lateness", **env)

    peer = {"huey": _huey, "celery": _celery}
    return [
        Contender(
            f"delayqueue_django {version('delayqueue-django')}",
            "1 run_delayqueue worker process, default settings",
            ours,
            send_burst.burst_of(send, worker),
        ),
        *(peer[name](redis_url) for name in peers),
    ]


@dataclass(frozen=True)
class PeerKeys:
    """Where a peer keeps messages not yet done: (command, key) pairs, each counting what
    one key holds, read in one pipelined round trip of plain commands, so that what the
    polls cost can be taken out of the command counts."""

    counted: tuple[tuple[str, str], ...]

    def left(self, probe: Any) -> int:
        pipe = probe.pipeline(transaction=False)
        for command, key in self.counted:
            pipe.execute_command(command.upper(), key)
        return sum(int(n) for n in pipe.execute())

    @property
    def poll(self) -> Counter[str]:
        return Counter(command for command, _ in self.counted)


def _huey(redis_url: str) -> Contender:
    from benchmarks import peer_huey

    queue, schedule = f"huey.redis.{peer_huey.NAME}", f"huey.schedule.{peer_huey.NAME}"

    def send(due_ms: int) -> None:
        eta = datetime.fromtimestamp(due_ms / 1000, UTC)
        peer_huey.record_lateness.schedule(args=(due_ms,), eta=eta)

    def send_at(due_ms: int, at: datetime) -> None:
        peer_huey.record_lateness.schedule(args=(due_ms,), eta=at)

    command = [sys.executable, "-m", "huey.bin.huey_consumer", "benchmarks.peer_huey.huey"]
    command += ["-w", "1", "-k", "thread"]
    keys = PeerKeys((("llen", queue), ("zcard", schedule)))
    return Contender(
        f"huey {version('huey')}",
        "huey_consumer -w 1 -k thread, defaults: scheduler interval 1 s, BRPOP timeout 1 s",
        _peer_trickle(command, send, keys, redis_url),
        send_burst.burst_of(send_at, _peer_worker(command, redis_url)),
    )


def _celery(redis_url: str) -> Contender:
    from benchmarks import peer_celery

    queue = peer_celery.QUEUE

    def send(due_ms: int) -> None:
        eta = datetime.fromtimestamp(due_ms / 1000, UTC)
        peer_celery.record_lateness.apply_async(args=(due_ms,), eta=eta)

    command = [sys.executable, "-m", "celery", "-A", "benchmarks.peer_celery", "worker"]
    command += ["-P", "solo", "-c", "1", "--without-gossip", "--without-mingle"]
    command += ["--without-heartbeat", "-Q", queue, "--loglevel", "WARNING"]
    # kombu's Redis transport keeps a delivered message, until acked, in the "unacked"
    # hash and the "unacked_index" sorted set.
    keys = PeerKeys((("llen", queue), ("hlen", "unacked"), ("zcard", "unacked_index")))

    def send_at(due_ms: int, at: datetime) -> None:
        peer_celery.record_lateness.apply_async(args=(due_ms,), eta=at)

    return Contender(
        f"celery {version('celery')}",
        "worker -P solo -c 1, eta tasks, no result backend, defaults: prefetch multiplier 4, "
        "acks before the task runs",
        _peer_trickle(command, send, keys, redis_url),
        send_burst.burst_of(send_at, _peer_worker(command, redis_url), CELERY_BURST),
    )


# The most messages celery's burst sends: its worker (-P solo, defaults) starts eta tasks
# due together some 50 ms apart here (about 20/s, the first on time), so 20,000 would take
# a quarter of an hour per run. Its send figures hold at this size; its drain rate is as
# measured, at this size.
CELERY_BURST = 500


def _peer_worker(command: list[str], redis_url: str) -> send_burst.Worker:
    """A peer's worker command for a burst, its handler writing to ``results``."""

    def worker(results: Path, probe: Any) -> PeerProcess:
        env = {"DQ_BENCH_REDIS_URL": redis_url, "DQ_BENCH_LATENESS_FILE": str(results)}
        return PeerProcess(command, env, probe)

    return worker


def _peer_trickle(
    command: list[str], send: Callable[[int], None], keys: PeerKeys, redis_url: str
) -> Callable[[int, float, Any], Trickle]:
    def trickle(count: int, spread: float, probe: Any) -> Trickle:
        with tempfile.TemporaryDirectory() as folder:
            results = Path(folder) / "lateness.txt"
            env = {"DQ_BENCH_REDIS_URL": redis_url, "DQ_BENCH_LATENESS_FILE": str(results)}
            with PeerProcess(command, env, probe):
                before = probes.server_usage(probe)
                lateness.send_paced(count, spread, send)
                lateness.wait_handled(results, count, spread)
                polls = wait_empty(keys, probe)
                used = probes.server_usage(probe).since(before)
                return Trickle.of(used, probes.probe_commands(polls, keys.poll), results)

    return trickle


def wait_empty(keys: PeerKeys, probe: Any, timeout: float = 30, interval: float = 0.01) -> int:
    """Poll the peer's keys until nothing is left in them; returns the polls made.

    celery acks a task on its event loop's next turn, a little after the task started (up to
    a few hundred ms for the last one, seen here): the window waits for that ack. huey
    deletes the task's revocation flag (an HDEL) just after the task returns, which no key
    shows: at worst the last message's HDEL falls outside the window.
    """
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        polls += 1
        if keys.left(probe) == 0:
            return polls
        if time.monotonic() > deadline:
            raise RuntimeError(f"{keys.left(probe)} messages still in the peer's keys")
        time.sleep(interval)


def _listening(probe: Any) -> int:
    """Connections blocked in BRPOP: both peers' workers wait for their queue so."""
    return sum(1 for client in probe.client_list() if client.get("cmd") == "brpop")


class PeerProcess:
    """A peer's worker command as a subprocess, ready on entry (blocked in BRPOP on its
    queue, unless it does not use BRPOP), stopped with SIGTERM (every peer's warm shutdown)
    on exit."""

    def __init__(
        self, command: list[str], env: dict[str, str], probe: Any, *, uses_brpop: bool = True
    ) -> None:
        self.probe = probe
        # A worker that polls instead (the async peers' of benchmarks/io_burst.py) is ready
        # once it runs: its caller sees it run a first job.
        self.uses_brpop = uses_brpop
        self.command = " ".join(command)
        # Another peer's worker that just exited may still be listed for a moment.
        _wait_for(lambda: _listening(probe) == 0, "the previous worker to disconnect")
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        self.process = subprocess.Popen(
            command, env=environment, cwd=ROOT, stdout=self._log, stderr=self._log
        )

    def __enter__(self) -> "PeerProcess":
        try:
            _wait_for(self._ready, f"{self.command} to listen")
        except BaseException:
            self.stop()
            raise
        # What the worker does once after it starts (declaring its queues, its scheduler's
        # first pass) stays out of the measured window.
        time.sleep(0.5)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.process.returncode}:\n{self.log()}")
        return not self.uses_brpop or _listening(self.probe) > 0

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {timeout:g} s for {what}")
        time.sleep(0.05)


def summary(measured: Trickle) -> str:
    values = measured.lateness_ms
    return (
        f"lateness p50 {statistics.median(values):.2f}, p99 {_p99(values):.2f}, "
        f"max {max(values):.2f} ms; {measured}"
    )


def _p99(values: list[float]) -> float:
    return percentile(values, 0.99)


# Each figure of a trickle: its words in the table, how it is read, its unit and digits.
FIGURES: list[tuple[str, Callable[[Trickle], float], str, int]] = [
    ("Redis CPU per message, idle included (INFO cpu)", lambda t: t.redis_cpu_us, "µs", 0),
    ("Redis commands per message, inside scripts included", lambda t: t.commands, "", 1),
    ("lateness p50", lambda t: statistics.median(t.lateness_ms), "ms", 2),
    ("lateness p99", lambda t: _p99(t.lateness_ms), "ms", 2),
    ("lateness max", lambda t: max(t.lateness_ms), "ms", 2),
]


def rows(
    count: int, spread: float, who: Sequence[Contender], measured: dict[str, list[Trickle]]
) -> list[Row]:
    """Each figure for ours, huey and celery in adjacent rows; the first figure's rows say
    how each was run."""
    what = f"peers, trickle of {count} over {spread:g} s"
    found: list[Row] = []
    for n, (figure, read, unit, digits) in enumerate(FIGURES):
        for c in who:
            setup = f" ({c.setup})" if n == 0 else ""
            values = [read(t) for t in measured[c.name]]
            found.append(Row(f"{what}: {figure} — {c.name}{setup}", values, unit, digits=digits))
    return found
