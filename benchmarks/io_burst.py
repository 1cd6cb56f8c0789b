"""An I/O-bound burst: many messages due at the same moment, whose handler waits 50 ms on
I/O, drained by one worker process. Ours twice, an ``async def`` handler on the worker's
event loop (``--async-concurrency``) and a sync one (``time.sleep``) on as many handler
threads (``--concurrency``), and the async peers arq, saq and streaq, each with its own
worker command, its concurrency setting the same and its other defaults.

Each run starts a fresh worker process per contender, on a flushed server, and times the
burst from the due time to the moment nothing is left to settle (ours: every message acked,
as the drain benchmark waits; a peer: its keys empty, every job finished, and each of its
handlers counted in a file). The worker's peak resident memory (VmHWM) is read at the end,
its CPU time over the burst too.

The peers run in a virtualenv of their own (``--async-peers-python``, by default
``.venv-async-peers``, which ``make bench`` makes with the ``async-peers`` extra): arq asks
for a redis-py older than 6, this project's benchmark runs 8, and one environment cannot
hold both. Their modules (benchmarks/peer_arq.py, peer_saq.py, peer_streaq.py, on
benchmarks/peer_io.py) import nothing of this project; each also sends its own jobs, in a
subprocess of that interpreter.
"""

import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import drain, probes
from benchmarks.peer_io import IO_WAIT_SECONDS
from benchmarks.peers import PeerKeys, PeerProcess, wait_empty
from benchmarks.report import Row
from benchmarks.workers import ROOT, WorkerProcesses, cpu_seconds, peak_rss_mb

PEERS_PYTHON = ROOT / ".venv-async-peers" / "bin" / "python"
INSTALL = (
    "python3 -m venv .venv-async-peers && "
    ".venv-async-peers/bin/pip install -e '.[async-peers]' (make bench does)"
)


@dataclass(frozen=True)
class Burst:
    rate: float  # messages per second, from the due time to the last one settled
    peak_rss_mb: float  # the worker process's peak resident memory (VmHWM)
    cpu_us_per_message: float  # the worker process's CPU time over the burst, per message
    scripts_per_message: float | None  # ours only: script calls (round trips) per message

    def __str__(self) -> str:
        return (
            f"{self.rate:,.0f} msg/s, peak RSS {self.peak_rss_mb:.0f} MiB, "
            f"worker CPU {self.cpu_us_per_message:.0f} µs per message"
        )


@dataclass(frozen=True)
class Contender:
    name: str
    setup: str
    burst: Callable[[int, Any], Burst]  # (count, probe client)


def ours(redis_url: str, concurrency: int, *, on_loop: bool) -> Contender:
    """One run_delayqueue process: the async handler on its event loop, or the sync one on
    ``concurrency`` handler threads."""
    if on_loop:
        name, handler = "async def handler (asyncio.sleep)", "benchmarks.handlers.io_wait"
        option = "--async-concurrency"
    else:
        name, handler = "sync handler (time.sleep)", "benchmarks.handlers.io_wait_in_thread"
        option = "--concurrency"

    def burst(count: int, probe: Any) -> Burst:
        with WorkerProcesses(1, redis_url, handler, option, str(concurrency)) as workers:
            before = workers.cpu_seconds()
            drained = drain.drain(count, probe)
            used = workers.cpu_seconds() - before
            peak = peak_rss_mb(workers.processes[0].pid)
        return Burst(drained.rate, peak, used * 1e6 / count, drained.scripts_per_message)

    return Contender(f"delayqueue_django, {name}", f"run_delayqueue {option} {concurrency}", burst)


@dataclass(frozen=True)
class AsyncPeer:
    package: str  # its distribution's name
    module: str  # its side of the benchmark: the worker's settings, and the sender
    worker: tuple[str, ...]  # the worker command, after the interpreter
    setup: str  # how it runs, for the table ({concurrency} filled in)
    keys: PeerKeys  # where it keeps jobs not finished


ASYNC_PEERS = {
    "arq": AsyncPeer(
        "arq",
        "benchmarks.peer_arq",
        ("-m", "arq", "benchmarks.peer_arq.WorkerSettings"),
        "python -m arq, max_jobs {concurrency}, defaults: poll_delay 0.5 s, results kept 1 h",
        PeerKeys((("zcard", "arq:queue"),)),
    ),
    "saq": AsyncPeer(
        "saq",
        "benchmarks.peer_saq",
        ("-m", "saq", "benchmarks.peer_saq.settings"),
        "python -m saq, concurrency {concurrency}, defaults: schedule timer 1 s",
        PeerKeys(
            (
                ("zcard", "saq:peers:incomplete"),
                ("llen", "saq:peers:queued"),
                ("llen", "saq:peers:active"),
            )
        ),
    ),
    "streaq": AsyncPeer(
        "streaq",
        "benchmarks.peer_streaq",
        ("-m", "benchmarks.peer_streaq"),
        "Worker.run_sync, concurrency {concurrency}, defaults: delayed tasks moved every "
        "0.5 s, prefetch as much again",
        PeerKeys(
            (
                ("zcard", "streaq:peers:queues:delayed:normal"),
                ("xlen", "streaq:peers:queues:normal"),
            )
        ),
    ),
}
# arq logs two lines a job at INFO by default; warnings only, as ours runs (-v 0).
_ARQ_QUIET = ("--custom-log-dict", "benchmarks.peer_arq.LOG_CONFIG")


def chosen_peers(names: str) -> list[str]:
    chosen = [name for name in names.split(",") if name]
    unknown = set(chosen) - set(ASYNC_PEERS)
    if unknown:
        raise SystemExit(
            f"unknown --async-peers {', '.join(sorted(unknown))}; choose from "
            f"{','.join(ASYNC_PEERS)} (or none: --async-peers '')"
        )
    return chosen


def require(python: Path, names: list[str]) -> None:
    """Stop with a clear message when the peers' interpreter is missing or lacks one."""
    if not names:
        return
    packages = [ASYNC_PEERS[name].package for name in names]
    found = python.exists() and (
        subprocess.run(
            [str(python), "-c", f"import {', '.join(packages)}"], capture_output=True, check=False
        ).returncode
        == 0
    )
    if not found:
        raise SystemExit(
            f"the async phase runs {', '.join(packages)} with {python}, which lacks them: "
            f"{INSTALL}; or --async-peers '' to run ours only"
        )


def peer(name: str, python: Path, redis_url: str, concurrency: int) -> Contender:
    spec = ASYNC_PEERS[name]
    version = subprocess.run(
        [str(python), "-c", f"from importlib.metadata import version; print(version({name!r}))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    worker = [str(python), *spec.worker, *(_ARQ_QUIET if name == "arq" else ())]
    # How long before the due time the jobs are sent: grown from how long a send took, when
    # one ran late, and kept for the next runs.
    lead = [4.0]

    def burst(count: int, probe: Any) -> Burst:
        with tempfile.TemporaryDirectory() as folder:
            done = Path(folder) / "done.txt"
            env = {
                "DQ_BENCH_REDIS_URL": redis_url,
                "DQ_BENCH_DONE_FILE": str(done),
                "DQ_BENCH_IO_CONCURRENCY": str(concurrency),
                "PYTHONPATH": str(ROOT),
            }
            while True:
                probe.flushall()
                done.unlink(missing_ok=True)
                with PeerProcess(worker, env, probe, uses_brpop=False) as process:
                    # Ready once it has run a first job (due now), outside the window.
                    _send(python, spec.module, env, 1, 0)
                    _wait_lines(done, 1, process)
                    wait_empty(spec.keys, probe)
                    due_ms = round((probes.server_time(probe) + lead[0]) * 1000)
                    took = _send(python, spec.module, env, count, due_ms)
                    if probes.server_time(probe) * 1000 > due_ms - 50:
                        lead[0] = took * 1.5 + 1  # late: the jobs may have started
                        continue
                    pid = process.process.pid
                    before = cpu_seconds(pid)
                    wait_empty(spec.keys, probe, timeout=120 + count / 100, interval=0.002)
                    finished = time.time()
                    used = cpu_seconds(pid) - before
                    handled = _lines(done) - 1
                    if handled != count:
                        raise RuntimeError(f"{name}: {handled} of {count} jobs finished")
                    peak = peak_rss_mb(pid)
                return Burst(count / (finished - due_ms / 1000), peak, used * 1e6 / count, None)

    return Contender(f"{name} {version}", spec.setup.format(concurrency=concurrency), burst)


def _send(python: Path, module: str, env: dict[str, str], count: int, due_ms: int) -> float:
    """Send the peer's jobs with its own client, in its interpreter; returns how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        [str(python), "-m", module, str(count), str(due_ms)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} failed to send:\n{result.stderr[-3000:]}")
    return time.monotonic() - started


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _wait_lines(path: Path, count: int, process: PeerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _lines(path) < count:
        if process.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{process.command} ran no job:\n{process.log()}")
        time.sleep(0.02)


def resting_rss_mb(redis_url: str) -> float:
    """The peak RSS of a worker process with run_delayqueue's defaults (one handler thread,
    no loop) that has started and handled nothing: what Django, this package and Python
    take before any concurrency, under both of ours."""
    with WorkerProcesses(1, redis_url, "benchmarks.handlers.noop") as workers:
        return peak_rss_mb(workers.processes[0].pid)


def contenders(
    redis_url: str, concurrency: int, peers: Sequence[str], python: Path
) -> list[Contender]:
    """Ours on the loop, ours on threads, then the peers: each run measures them in turn."""
    return [
        ours(redis_url, concurrency, on_loop=True),
        ours(redis_url, concurrency, on_loop=False),
        *(peer(name, python, redis_url, concurrency) for name in peers),
    ]


def rows(
    count: int,
    concurrency: int,
    who: Sequence[Contender],
    measured: dict[str, list[Burst]],
    resting: list[float],
) -> list[Row]:
    """Each figure for every contender in adjacent rows, then the async handler's ratios to
    the threads and to the best peer, each taken within a run (the runs interleave them).
    ``resting``: a worker process's peak RSS at rest in each run (resting_rss_mb)."""
    what = (
        f"I/O-bound burst, {count:,} due together, handler waits {IO_WAIT_SECONDS * 1000:.0f} "
        "ms, 1 worker process"
    )
    on_loop, threads, *peers = who
    found: list[Row] = []
    for c in who:
        target = ""
        if c is on_loop:
            target = "≥ the threads', ≥ 4 times the best async peer's"
        found.append(
            Row(
                f"{what}: throughput — {c.name} ({c.setup})",
                [b.rate for b in measured[c.name]],
                "msg/s",
                target,
            )
        )
    loop_rates = [b.rate for b in measured[on_loop.name]]
    found.append(
        Row(
            f"{what}: async handler's throughput ÷ {concurrency:,} threads'",
            _ratios(loop_rates, [b.rate for b in measured[threads.name]]),
            "",
            "≥ 1",
            digits=2,
        )
    )
    if peers:
        by_peer = [[b.rate for b in measured[p.name]] for p in peers]
        best = [max(runs) for runs in zip(*by_peer, strict=True)]
        found.append(
            Row(
                f"{what}: async handler's throughput ÷ the best async peer's in the same run",
                _ratios(loop_rates, best),
                "",
                "≥ 4",
                digits=2,
            )
        )
    for c in who:
        found.append(
            Row(
                f"{what}: the worker process's peak RSS (VmHWM) — {c.name}",
                [b.peak_rss_mb for b in measured[c.name]],
                "MiB",
                "",
            )
        )
    found.append(
        Row(
            "for comparison: the peak RSS of a run_delayqueue process at rest (defaults: one "
            "handler thread, no loop; started, nothing handled)",
            resting,
            "MiB",
        )
    )
    loop_above, threads_above = (
        _differences([b.peak_rss_mb for b in measured[c.name]], resting) for c in (on_loop, threads)
    )
    found.append(
        Row(
            f"{what}: the peak RSS above that at rest — async handler, "
            f"--async-concurrency {concurrency:,}",
            loop_above,
            "MiB",
        )
    )
    found.append(
        Row(
            f"{what}: the peak RSS above that at rest — sync handler, "
            f"--concurrency {concurrency:,}",
            threads_above,
            "MiB",
        )
    )
    found.append(
        Row(
            f"{what}: the async handler's peak RSS above that at rest ÷ the threads'",
            _ratios(loop_above, threads_above),
            "",
            "a fraction",
            digits=2,
        )
    )
    for c in who:
        found.append(
            Row(
                f"{what}: the worker process's CPU time per message — {c.name}",
                [b.cpu_us_per_message for b in measured[c.name]],
                "µs",
            )
        )
    for c in (on_loop, threads):
        found.append(
            Row(
                f"{what}: script calls (round trips) per message — {c.name}",
                [b.scripts_per_message or 0.0 for b in measured[c.name]],
                "",
                "the same on the loop as on threads",
                digits=3,
            )
        )
    return found


def _ratios(values: Sequence[float], others: Sequence[float]) -> list[float]:
    return [a / b for a, b in zip(values, others, strict=True)]


def _differences(values: Sequence[float], others: Sequence[float]) -> list[float]:
    return [a - b for a, b in zip(values, others, strict=True)]
