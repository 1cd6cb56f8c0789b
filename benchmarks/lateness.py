"""A trickle: messages with delays spread over a few seconds while a worker process runs.
How long after its due time each handler started, and what the whole trickle (each send,
wake-up, fetch and ack, and the server's idle time between them) cost Redis per message.

The pacing (``send_paced``), the wait (``wait_handled``) and the accounting (``Trickle.of``)
are shared with the peers benchmark (benchmarks/peers.py), so huey and celery are measured
exactly as we are."""

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import probes
from benchmarks.workers import WorkerProcesses
from delayqueue_django import get_queue


@dataclass(frozen=True)
class Trickle:
    lateness_ms: list[float]  # per message: when its handler started, after its due time
    redis_cpu_us: float  # per message: the server's CPU time over the window (INFO cpu)
    script_us: float  # per message: the server's time in script calls (INFO commandstats)
    commands: float  # per message: every command Redis ran, inside scripts included
    script_calls: float  # per message: script and function calls (a send, fetches, an ack)

    @classmethod
    def of(cls, used: probes.ServerUsage, probe_calls: Counter[str], results: Path) -> "Trickle":
        """The figures of one trickle from the server's usage over its window, less the
        commands the benchmark itself sent (``probe_calls``), and the workers' records."""
        lateness_ms = [float(line) for line in results.read_text().split()]
        count = len(lateness_ms)
        return cls(
            lateness_ms=lateness_ms,
            redis_cpu_us=used.cpu_seconds * 1e6 / count,
            script_us=used.script_usec / count,
            commands=sum((used.calls - probe_calls).values()) / count,
            script_calls=probes.script_calls(used.calls) / count,
        )

    def __str__(self) -> str:
        return (
            f"Redis CPU {self.redis_cpu_us:.0f} µs, scripts {self.script_us:.0f} µs, "
            f"{self.commands:.1f} commands, {self.script_calls:.2f} script calls per message"
        )


def with_worker(count: int, spread: float, redis_url: str, probe_client: Any) -> Trickle:
    """One trickle on a fresh worker process (``run_delayqueue``) that records lateness."""
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "lateness.txt"
        env = {"DQ_BENCH_LATENESS_FILE": str(results)}
        with WorkerProcesses(1, redis_url, "benchmarks.handlers.record_lateness", **env):
            return trickle(count, spread, results, probe_client)


def trickle(count: int, spread: float, results: Path, probe_client: Any) -> Trickle:
    """Send ``count`` messages due over ``spread`` seconds (from 0.2 s from now), each sent
    ahead of its due time as a view would, and read the worker's record of how late each
    handler started (``benchmarks.handlers.record_lateness`` writes ``results``).

    The server's usage is read just before the first send and once the last message is
    acked: everything Redis did in between (the worker's idle polling and heartbeats too)
    is charged to the messages, as a shared Redis would see it.
    """
    queue = get_queue()
    before = probes.server_usage(probe_client)

    def send(due_ms: int) -> None:
        queue.send({"due_ms": due_ms}, at=datetime.fromtimestamp(due_ms / 1000, UTC))

    send_paced(count, spread, send)
    wait_handled(results, count, spread)
    # The handlers have started; their acks follow within milliseconds.
    _, polls = probes.wait_drained(queue, 0.01, timeout=30)
    used = probes.server_usage(probe_client).since(before)
    return Trickle.of(used, probes.probe_commands(polls), results)


def send_paced(count: int, spread: float, send: Callable[[int], None]) -> None:
    """Call ``send(due_ms)`` for ``count`` due times spread over ``spread`` seconds, from
    0.2 s from now, each call a little ahead of its due time."""
    step = spread / count
    start = time.time() + 0.2
    for n in range(count):
        # Due times on whole ms, so the payload's due time is exactly the one Redis keeps.
        send(round((start + n * step) * 1000))
        # Sends trail ahead of the due times, interleaved with the deliveries.
        time.sleep(step / 4)


def wait_handled(results: Path, count: int, spread: float) -> None:
    """Wait until ``count`` handlers have written their line to ``results``."""
    deadline = time.monotonic() + spread + 30
    while _lines(results) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_lines(results)} of {count} messages were handled")
        time.sleep(0.05)


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@dataclass(frozen=True)
class Floor:
    """What a trickle's pace alone costs the server, per message: one bare PING at each
    message's time (a round trip reaching a server idle since the last one), and the same
    window with no request at all (its timers and housekeeping)."""

    ping_cpu_us: float
    idle_cpu_us: float

    def __str__(self) -> str:
        return f"PING {self.ping_cpu_us:.0f} µs, idle {self.idle_cpu_us:.0f} µs per message"


def floor(count: int, spread: float, probe_client: Any) -> Floor:
    """Redis CPU (INFO cpu) per PING when ``count`` of them are spread over ``spread``
    seconds, as the trickle's messages are, then over as long a window with none; both per
    message. A trickle's calls cannot cost less than such a PING each: it is the price of a
    request itself on a server that went idle before it."""
    step = spread / count

    def window(request: Callable[[], object]) -> float:
        before = probes.server_usage(probe_client)
        start = time.monotonic()
        for n in range(count):
            request()
            time.sleep(max(start + (n + 1) * step - time.monotonic(), 0.0))
        return probes.server_usage(probe_client).since(before).cpu_seconds * 1e6 / count

    return Floor(ping_cpu_us=window(probe_client.ping), idle_cpu_us=window(lambda: None))
