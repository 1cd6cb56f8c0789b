"""The peers' burst (benchmarks/peers.py): ``count`` messages sent by one producer, one call
each, all due at one instant, then drained by one worker process at concurrency 1; for us,
huey and celery alike, on the same private Redis.

The producer is this process, sending with each queue's own client call (ours
``delayqueue_django.send``, huey's ``task.schedule``, celery's ``apply_async``, each with
the same due time): its send rate (wall time over the loop) and its CPU per send (process
time over the loop). Each worker's handler records how late it started
(``benchmarks.handlers.note_lateness``); as every message has the same due time, the latest
start is the drain's length, from the due time to the last handler's start.

The due time is set before the first send, far enough ahead for the whole loop to end
before it (or the workers would start early): when a loop ends late, the burst is made
again with a worker started anew and a longer lead, which the next runs keep.
"""

import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import lateness, probes
from benchmarks.report import Row


@dataclass(frozen=True)
class SendBurst:
    count: int  # messages sent and drained
    send_rate: float  # messages per second over the send loop (wall time)
    send_cpu_us: float  # the producer's CPU time (process time) per send
    drain_rate: float  # messages per second from the due time to the last handler's start

    def __str__(self) -> str:
        return (
            f"send {self.send_rate:,.0f}/s at {self.send_cpu_us:.1f} µs CPU each, "
            f"drain {self.drain_rate:,.0f}/s"
        )


# send(due_ms, at): one message due at ``due_ms`` (ms since the epoch), ``at`` as a datetime.
Send = Callable[[int, datetime], object]
# worker(results, probe): the contender's one worker process, ready on entry, its handler
# writing to ``results``; stopped on exit.
Worker = Callable[[Path, Any], AbstractContextManager[object]]


def burst_of(send: Send, worker: Worker, cap: int | None = None) -> Callable[[int, Any], SendBurst]:
    """A contender's burst: ``burst(count, probe)``, of at most ``cap`` messages."""
    # How long before the due time the sends start: grown when a loop ended late, and kept
    # for the next runs (a guess of 2,000 sends per second at first).
    lead = [0.0]

    def burst(count: int, probe: Any) -> SendBurst:
        count = count if cap is None else min(count, cap)
        lead[0] = lead[0] or 1 + count / 2000
        while True:
            probe.flushall()
            with tempfile.TemporaryDirectory() as folder:
                results = Path(folder) / "lateness.txt"
                with worker(results, probe):
                    measured = _one(count, send, results, probe, lead[0])
            if isinstance(measured, _Measured):
                # Room for a slower loop next time, without waiting much longer than needed.
                lead[0] = max(lead[0], measured.seconds * 1.5 + 0.5)
                return measured.burst
            lead[0] = measured * 1.5 + 1  # late: the loop took this long

    return burst


@dataclass(frozen=True)
class _Measured:
    burst: SendBurst
    seconds: float  # how long the send loop took


def _one(count: int, send: Send, results: Path, probe: Any, lead: float) -> "_Measured | float":
    """One burst; the loop's seconds instead when it ended too close to the due time."""
    due_ms = round((probes.server_time(probe) + lead) * 1000)
    at = datetime.fromtimestamp(due_ms / 1000, UTC)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        send(due_ms, at)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if probes.server_time(probe) * 1000 > due_ms - 50:
        return wall
    lateness.wait_handled(results, count, lead + count / 200)
    latest_s = max(float(line) for line in results.read_text().split()) / 1000
    return _Measured(SendBurst(count, count / wall, cpu * 1e6 / count, count / latest_s), wall)


# Each figure of a burst: its words in the table, how it is read, its unit and digits, and
# the target of ours ÷ huey's.
FIGURES: list[tuple[str, Callable[[SendBurst], float], str, int, str]] = [
    ("send rate, one call per message", lambda b: b.send_rate, "msg/s", 0, "≥ 1"),
    ("the producer's CPU per send (process time)", lambda b: b.send_cpu_us, "µs", 1, "≤ 1"),
    ("drain rate, due time to the last handler's start", lambda b: b.drain_rate, "msg/s", 0, "≥ 8"),
]


def rows(count: int, who: Sequence[str], measured: dict[str, list[SendBurst]]) -> list[Row]:
    """Each figure for every contender in adjacent rows (ours first), then ours ÷ huey's
    when huey ran: the ratio of each run's pair, measured one after the other."""
    what = (
        f"peers, burst of {count:,} due at one instant, sent one call each, then drained "
        "by 1 worker process at concurrency 1"
    )
    ours, found = who[0], []
    huey = next((name for name in who if name.startswith("huey")), None)
    for figure, read, unit, digits, target in FIGURES:
        for name in who:
            values = [read(b) for b in measured[name]]
            fewer = measured[name][0].count
            of = f" ({fewer:,} messages only: see benchmarks/peers.py)" if fewer != count else ""
            found.append(Row(f"{what}: {figure} — {name}{of}", values, unit, digits=digits))
        if huey is not None:
            ratios = [
                read(a) / read(b) for a, b in zip(measured[ours], measured[huey], strict=True)
            ]
            found.append(Row(f"{what}: {figure}, ours ÷ huey's", ratios, "", target, digits=2))
    return found
