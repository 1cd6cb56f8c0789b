"""``python -m benchmarks`` (``make bench``): every benchmark, then the Markdown table.

Starts a private redis-server on a free port (never the machine's own Redis; valkey-server
where there is no redis-server, or with DQ_TEST_SERVER=valkey), runs real
worker processes against it, and prints the medians of several runs with their spread.
The shards benchmark starts a private Redis Cluster of its own the same way; the peers
benchmark runs huey's and celery's own workers on the private server (the optional peers
extra: pip install -e ".[peers]").
Progress goes to stderr, the table to stdout.
"""

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import django
import redis
from django.conf import settings
from django.test import override_settings
from redis.utils import HIREDIS_AVAILABLE

from benchmarks import (
    drain,
    expiry,
    flow,
    groups,
    history,
    idle,
    io_burst,
    keys,
    kills,
    lateness,
    outbox,
    peers,
    probes,
    scale,
    send,
    send_burst,
    shards,
)
from benchmarks.report import Row, percentile, table
from benchmarks.workers import SupervisedWorkers, WorkerProcesses
from tests.redis_servers import RedisClusterServers, RedisServer

PHASES = (
    "send",
    "keys",
    "groups",
    "expiry",
    "history",
    "drain",
    "flow",
    "processes",
    "lateness",
    "idle",
    "scale",
    "outbox",
    "kills",
    "shards",
    "peers",
    "async",
)
NOOP = "benchmarks.handlers.noop"

T = TypeVar("T")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    add = parser.add_argument
    add("--runs", type=int, default=5, help="runs of each repeated benchmark (default: 5)")
    add("--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    add("--send-messages", type=int, default=20_000, help="single sends per run")
    add("--bulk-messages", type=int, default=100_000, help="messages in one send_many per run")
    add(
        "--keys-memory-messages",
        type=int,
        default=100_000,
        help="keyed messages whose memory is measured (keys)",
    )
    add(
        "--keys-reclaim",
        type=int,
        default=1_000_000,
        help="keys sent with unique_for, whose holds Redis reclaims (keys; default: 1000000)",
    )
    add(
        "--keys-window",
        type=float,
        default=1.0,
        help="the unique_for of those keys, in seconds (keys; default: 1)",
    )
    add(
        "--expiry-messages",
        type=int,
        default=50_000,
        help="messages per mode of the expiry benchmark (default: 50000)",
    )
    add(
        "--history-messages",
        type=int,
        default=10_000,
        help="messages per step of the attempt records benchmark (default: 10000)",
    )
    add("--drain-messages", type=int, default=20_000, help="messages due together per drain")
    add("--workers", default="1,2,4", help="worker process counts to drain with (default: 1,2,4)")
    add(
        "--lateness-messages",
        type=int,
        default=500,
        help="messages in the trickle (lateness and peers): their lateness, and Redis's cost "
        "per message",
    )
    add(
        "--lateness-spread",
        type=float,
        default=5.0,
        help="seconds the trickle's due times spread over (lateness and peers)",
    )
    add(
        "--burst-messages",
        type=int,
        default=20_000,
        help="messages sent one call each, then drained, in the peers' burst (peers; "
        "default: 20000)",
    )
    add(
        "--peers",
        default=",".join(peers.PEER_PACKAGES),
        help="the peers to run the trickle and the burst with, comma-separated; '' for ours "
        f"only (peers; default: {','.join(peers.PEER_PACKAGES)})",
    )
    add(
        "--flow-rate",
        type=int,
        default=500,
        help="RATE_LIMIT per second of the flow benchmark's drain (default: 500)",
    )
    add(
        "--flow-seconds",
        type=float,
        default=60.0,
        help="how long that drain lasts at the limit, in seconds (default: 60)",
    )
    add("--idle-seconds", type=float, default=10.0)
    add("--scale-pending", type=int, default=1_000_000, help="pending messages for the scale run")
    add("--scale-due", type=int, default=100_000, help="messages due in the same second")
    add("--latency-samples", type=int, default=2_000, help="timed single sends, empty and full")
    add("--relay-messages", type=int, default=100_000, help="outbox rows one relay moves per run")
    add("--exactly-once-messages", type=int, default=5_000, help="handled per exactly-once run")
    add(
        "--kill-messages",
        type=int,
        default=20_000,
        help="outbox rows relayed, and EXACTLY_ONCE messages handled, per run of the kills "
        "benchmark (default: 20000)",
    )
    add(
        "--shards",
        default="1,3,6",
        help="SHARDS values of the sharded queue on the cluster (default: 1,3,6)",
    )
    add("--masters", type=int, default=3, help="cluster masters for --only shards (default: 3)")
    add(
        "--shard-workers",
        type=int,
        default=2,
        help="worker processes draining the sharded queue (default: 2)",
    )
    add(
        "--io-messages",
        type=int,
        default=5_000,
        help="messages due together in the I/O-bound burst (async; default: 5000)",
    )
    add(
        "--io-concurrency",
        type=int,
        default=1_000,
        help="the burst's --async-concurrency, --concurrency and the peers' concurrency "
        "setting (async; default: 1000)",
    )
    add(
        "--async-peers",
        default=",".join(io_burst.ASYNC_PEERS),
        help="the async peers to run the burst with, comma-separated; '' for ours only "
        f"(async; default: {','.join(io_burst.ASYNC_PEERS)})",
    )
    add(
        "--async-peers-python",
        type=Path,
        default=io_burst.PEERS_PYTHON,
        help="the interpreter of the async peers' own virtualenv (async; default: "
        ".venv-async-peers/bin/python, which make bench makes)",
    )
    add("--quick", action="store_true", help="tiny sizes and one run: checks the suite works")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
        args.send_messages, args.bulk_messages, args.drain_messages = 200, 1_000, 500
        args.keys_memory_messages, args.keys_reclaim, args.keys_window = 1_000, 2_000, 0.2
        args.expiry_messages = 1_000
        args.history_messages = 200
        args.workers, args.lateness_messages, args.lateness_spread = "1", 20, 0.5
        args.burst_messages = 300
        args.flow_rate, args.flow_seconds = 200, 2.0
        args.idle_seconds, args.scale_pending, args.scale_due = 1.0, 2_000, 500
        args.latency_samples = 50
        args.relay_messages, args.exactly_once_messages = 2_000, 200
        args.kill_messages = 300
        args.shard_workers = 1
        args.io_messages, args.io_concurrency = 200, 100
    return args


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def repeat(runs: int, what: str, measure: Callable[[], T]) -> list[T]:
    results = []
    for run in range(runs):
        results.append(measure())
        progress(f"  {what}, run {run + 1}/{runs}: {results[-1]}")
    return results


def bench_send(args: argparse.Namespace, probe: Any) -> list[Row]:
    progress("send")

    def single() -> float:
        probe.flushall()
        return send.single_rate(args.send_messages)

    def bulk() -> float:
        probe.flushall()
        return send.bulk_rate(args.bulk_messages)

    def cpus() -> tuple[float, float]:
        # One after the other, so a change in the machine's load falls on both.
        probe.flushall()
        sync = send.single_cpu_us(args.send_messages)
        probe.flushall()
        return sync, send.async_cpu_us(args.send_messages)

    singles = repeat(args.runs, "send()", single)
    cpu = repeat(args.runs, "send() and asend(), CPU µs per call", cpus)
    pings = repeat(args.runs, "PING", lambda: send.ping_rate(args.send_messages))
    bulks = repeat(args.runs, "send_many", bulk)
    probe.flushall()
    trips = send.round_trips_per_send(probe)
    server_us = send.server_us_per_send(probe, min(args.send_messages, 5_000))
    return [
        Row("send(), one call per message, one process", singles, "msg/s", "≥ 10,000/s"),
        Row(
            "send(), one call per message: the producer's CPU per call (process time)",
            [sync for sync, _ in cpu],
            "µs",
            "≤ huey's enqueue (see peers)",
            digits=1,
        ),
        Row(
            "asend(), one call per message, on redis.asyncio: the producer's CPU per call",
            [async_ for _, async_ in cpu],
            "µs",
            digits=1,
        ),
        Row("for comparison: bare redis-py PING round trips, same client", pings, "/s", ""),
        Row("Redis round trips per send()", [trips], "", "1", digits=2),
        Row("Redis time per send() script call (INFO commandstats)", [server_us], "µs", "", 1),
        Row(f"send_many, {args.bulk_messages:,} messages", bulks, "msg/s", "≥ 100,000/s"),
    ]


def bench_groups(args: argparse.Namespace, probe: Any) -> list[Row]:
    progress("groups: grouped messages sent and drained beside plain ones")
    redis_us: dict[str, list[float]] = {mode: [] for mode in groups.MODES}
    rates: dict[str, list[float]] = {mode: [] for mode in groups.MODES}
    for run in range(args.runs):
        # Interleaved by mode within each run: the ratios compare runs made side by side.
        for mode in groups.MODES:
            used, rate = groups.send_and_drain(args.drain_messages, mode, probe)
            redis_us[mode].append(used)
            rates[mode].append(rate)
        done = ", ".join(f"{mode} {redis_us[mode][-1]:.1f} µs" for mode in groups.MODES)
        progress(f"  run {run + 1}/{args.runs}: Redis time per message: {done}")
    return groups.rows(args.drain_messages, redis_us, rates)


def bench_keys(args: argparse.Namespace, probe: Any) -> list[Row]:
    progress("keys: keyed sends beside plain ones, bytes per key, holds reclaimed")
    singles: dict[str, list[float]] = {mode: [] for mode in keys.MODES}
    bulks: dict[str, list[float]] = {mode: [] for mode in keys.MODES}
    bulk_redis_us: dict[str, list[float]] = {mode: [] for mode in keys.MODES}
    for run in range(args.runs):
        # Interleaved by mode within each run: the ratios compare runs made side by side.
        for mode in keys.MODES:
            probe.flushall()
            singles[mode].append(keys.single_rate(args.send_messages, mode))
            probe.flushall()
            probe.config_resetstat()
            bulks[mode].append(keys.bulk_rate(args.bulk_messages, mode))
            used = probes.server_usage(probe).script_usec
            bulk_redis_us[mode].append(used / args.bulk_messages)
        done = ", ".join(
            f"{mode} {singles[mode][-1]:,.0f}/s and {bulks[mode][-1]:,.0f}/s" for mode in keys.MODES
        )
        progress(f"  run {run + 1}/{args.runs}: send() and send_many: {done}")
    memory = keys.memory_per_key(args.keys_memory_messages, probe)
    progress(f"  {memory}")
    reclaims = repeat(
        args.runs,
        "holds reclaimed",
        lambda: keys.reclaim(args.keys_reclaim, args.keys_window, probe),
    )
    return [
        *keys.rate_rows("send(), one call per message", args.send_messages, singles, ""),
        *keys.rate_rows("send_many", args.bulk_messages, bulks, ""),
        *keys.redis_time_rows("send_many", bulk_redis_us),
        *keys.memory_rows(args.keys_memory_messages, memory),
        *keys.reclaim_rows(args.keys_reclaim, args.keys_window, reclaims),
    ]


def bench_expiry(args: argparse.Namespace, probe: Any) -> list[Row]:
    progress("expiry: expiring messages beside plain ones, and expired ones dead-lettered")
    cycles: dict[str, list[expiry.Cycle]] = {mode: [] for mode in expiry.MODES}
    for run in range(args.runs):
        # Interleaved by mode within each run: the ratio compares runs made side by side.
        for mode in expiry.MODES:
            cycles[mode].append(expiry.cycle(args.expiry_messages, mode, probe))
        done = ", ".join(
            f"{mode} {cycles[mode][-1].redis_us_per_message:.1f} µs" for mode in expiry.MODES
        )
        progress(f"  run {run + 1}/{args.runs}: {done}")
    return expiry.rows(args.expiry_messages, cycles)


def bench_history(args: argparse.Namespace, probe: Any) -> list[Row]:
    progress("history: commands per ack and nack, bytes per attempt record")
    runs, typical, bounded = [], [], []
    for run in range(args.runs):
        runs.append(history.costs(args.history_messages, probe))
        typical.append(history.bytes_per_record(args.history_messages, probe, at_bounds=False))
        bounded.append(
            history.bytes_per_record(args.history_messages // 10 or 1, probe, at_bounds=True)
        )
        sizes = f"{typical[-1]:.0f} and {bounded[-1]:.0f} bytes"
        progress(f"  run {run + 1}/{args.runs}: {runs[-1]}, {sizes}")
    return history.rows(args.history_messages, runs, typical, bounded)


def bench_drain(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    rows: list[Row] = []
    per_message: list[Row] = []
    for count in [int(n) for n in args.workers.split(",")]:
        progress(f"drain with {count} worker process(es)")
        with WorkerProcesses(count, server.url, NOOP):
            drains = repeat(args.runs, "drain", lambda: drain.drain(args.drain_messages, probe))
        plural = "process" if count == 1 else "processes"
        rows.append(
            Row(
                f"drain {args.drain_messages:,} due together, {count} worker {plural}",
                [d.rate for d in drains],
                "msg/s",
                "≥ 25,000/s" if count == 1 else "more than 1 process, until Redis/cores saturate",
            )
        )
        if not per_message:
            per_message = [
                Row(
                    f"Redis commands per handled message ({count} {plural}; inside scripts "
                    "included)",
                    [d.commands_per_message for d in drains],
                    "",
                    "as few as possible",
                    digits=2,
                ),
                Row(
                    f"script calls (round trips) per handled message ({count} {plural})",
                    [d.scripts_per_message for d in drains],
                    "",
                    "",
                    digits=3,
                ),
                Row(
                    f"Redis time per handled message, in those scripts ({count} {plural})",
                    [d.redis_us_per_message for d in drains],
                    "µs",
                    "",
                    digits=1,
                ),
                Row(
                    f"Redis CPU per message, {args.drain_messages:,} due together (send_many + "
                    f"fetch + ack, {count} {plural}; INFO cpu)",
                    [d.redis_cpu_us_per_message for d in drains],
                    "µs",
                    "≤ 40 µs",
                    digits=1,
                ),
            ]
    return rows + per_message


def bench_flow(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    rate, count = args.flow_rate, round(args.flow_rate * args.flow_seconds)
    progress(f"flow: a drain of {count:,} under RATE_LIMIT {rate}/s, 2 workers")
    limited = flow.queue_env({"RATE_LIMIT": f"{rate}/s"})
    with WorkerProcesses(2, server.url, NOOP, **limited):
        drains = repeat(args.runs, "rate-limited drain", lambda: drain.drain(count, probe))
    rows = [
        Row(
            f"drain {count:,} due together under RATE_LIMIT {rate}/s, 2 worker processes: "
            "handed out over the run, as a share of the most the limit allows in that time",
            [flow.accuracy_percent(count, d.seconds, rate) for d in drains],
            "%",
            "≤ 100 %, close to it",
            digits=1,
        )
    ]
    progress(f"flow: the cost per message of the gates, {args.drain_messages:,} due together")
    costs: dict[str, list[drain.Drain]] = {name: [] for name in flow.COST_OPTIONS}
    for run in range(args.runs):
        # Interleaved within each run: the rows compare runs made side by side.
        for name, options in flow.COST_OPTIONS.items():
            # The sender spreads its messages over the workers' shards.
            sending = {**settings.DELAYQUEUES["default"], "SHARDS": options.get("SHARDS", 1)}
            with (
                WorkerProcesses(1, server.url, NOOP, **flow.queue_env(options)),
                override_settings(DELAYQUEUES={"default": sending}),
            ):
                costs[name].append(drain.drain(args.drain_messages, probe))
        progress(f"  run {run + 1}/{args.runs} done")
    for name, measured in costs.items():
        rows.append(
            Row(
                f"Redis time per handled message, {name} (1 process)",
                [d.redis_us_per_message for d in measured],
                "µs",
                "" if name == flow.baseline(name) else f"{flow.baseline(name)}'s, or a little more",
                digits=1,
            )
        )
        rows.append(
            Row(
                f"Redis commands per handled message, {name} (1 process)",
                [d.commands_per_message for d in measured],
                "",
                "",
                digits=2,
            )
        )
        rows.append(
            Row(
                f"script calls (round trips) per handled message, {name} (1 process)",
                [d.scripts_per_message for d in measured],
                "",
                "",
                digits=3,
            )
        )
    return rows


def bench_processes(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    """The drain by N worker processes under one command's supervisor (``--processes N``)
    beside N separate commands, measured one after the other in the same phase, so that
    the ratio compares like with like on a shared machine; and where the CPU goes, process
    by process (the workers, Redis, this process polling for the end), with the scaling
    from the first count's command to each other's, run by run."""
    rows: list[Row] = []
    first: tuple[int, list[float]] | None = None
    cores = os.cpu_count() or 1
    for count in [int(n) for n in args.workers.split(",")]:
        plural = "process" if count == 1 else "processes"
        rates: dict[str, list[float]] = {}
        supervised: list[drain.Drain] = []
        for how, kind in (("separate", WorkerProcesses), ("supervised", SupervisedWorkers)):
            progress(f"drain with {count} worker {plural}, {how}")
            with kind(count, server.url, NOOP) as workers:

                def measure(workers: WorkerProcesses = workers) -> drain.Drain:
                    return drain.drain(args.drain_messages, probe, cpu=workers.tree_cpu_seconds)

                drains = repeat(args.runs, "drain", measure)
            rates[how] = [d.rate for d in drains]
            if how == "supervised":
                supervised = drains
        what = f"drain {args.drain_messages:,} due together, {count} worker {plural}"
        cpu = f"CPU per message, {what}, one command --processes {count}, due time to last ack"
        rows += [
            Row(f"{what}, one command --processes {count}", rates["supervised"], "msg/s"),
            Row(f"{what}, {count} separate commands", rates["separate"], "msg/s"),
            Row(
                f"{what}: one command's rate / separate commands' rate",
                [a / b for a, b in zip(rates["supervised"], rates["separate"], strict=True)],
                "",
                "≈ 1 (the supervisor costs nothing measurable)",
                digits=2,
            ),
            Row(
                f"{cpu}: the worker processes (the supervisor included)",
                [d.workers_cpu_us_per_message or 0.0 for d in supervised],
                "µs",
                digits=1,
            ),
            Row(
                f"{cpu}: Redis (INFO cpu)",
                [d.drain_redis_cpu_us_per_message for d in supervised],
                "µs",
                digits=1,
            ),
            Row(
                f"{cpu}: the benchmark's process (polling for the end)",
                [d.probe_cpu_us_per_message for d in supervised],
                "µs",
                digits=1,
            ),
            Row(
                f"{cpu}: those processes' CPU per second of the drain (cores busy, of {cores})",
                [d.cores_busy or 0.0 for d in supervised],
                "",
                digits=2,
            ),
        ]
        if first is None:
            first = (count, rates["supervised"])
        else:
            base, base_rates = first
            rows.append(
                Row(
                    f"{what}: one command --processes {count}'s rate / --processes {base}'s, "
                    "run by run",
                    [a / b for a, b in zip(rates["supervised"], base_rates, strict=True)],
                    "",
                    "≥ 1.6 at 2 processes on 2 cores (#34); see the performance page",
                    digits=2,
                )
            )
    return rows


def bench_lateness(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    progress("lateness: a trickle")
    p50, p99, worst, cpu, scripts, commands, calls = [], [], [], [], [], [], []
    pings, idles = [], []
    for run in range(args.runs):
        probe.flushall()
        measured = lateness.with_worker(
            args.lateness_messages, args.lateness_spread, server.url, probe
        )
        floor = lateness.floor(args.lateness_messages, args.lateness_spread, probe)
        pings.append(floor.ping_cpu_us)
        idles.append(floor.idle_cpu_us)
        values = measured.lateness_ms
        p50.append(statistics.median(values))
        p99.append(percentile(values, 0.99))
        worst.append(max(values))
        cpu.append(measured.redis_cpu_us)
        scripts.append(measured.script_us)
        commands.append(measured.commands)
        calls.append(measured.script_calls)
        summary = f"p50 {p50[-1]:.2f}, p99 {p99[-1]:.2f}, max {worst[-1]:.2f} ms; {measured}; "
        summary += f"floor: {floor}"
        progress(f"  run {run + 1}/{args.runs}: {summary}")
    what = f"lateness, {args.lateness_messages} messages over {args.lateness_spread:g} s"
    return [
        Row(f"{what}: p50", p50, "ms", "≤ 2 ms", digits=2),
        Row(f"{what}: p99", p99, "ms", "≤ 2 ms (#34)", digits=2),
        Row(f"{what}: max", worst, "ms", "", digits=2),
        Row(
            f"trickle, the same {args.lateness_messages} messages (send + wake-up + fetch + "
            "ack, 1 worker process): Redis CPU per message, the server's idle time in the "
            "window included (INFO cpu)",
            cpu,
            "µs",
            "≤ 250 µs",
        ),
        Row(
            "trickle's floor: Redis CPU per bare PING sent at the same pace, one per message "
            "(a request reaching an idle server), idle time included",
            pings,
            "µs",
            "",
        ),
        Row(
            "trickle's floor: Redis CPU per message's share of the same window idle",
            idles,
            "µs",
            "",
        ),
        Row(
            "trickle: Redis time in script calls per message (INFO commandstats)",
            scripts,
            "µs",
            "≤ 60 µs",
            digits=1,
        ),
        Row(
            "trickle: Redis commands per message, inside scripts included",
            commands,
            "",
            "≤ 15 (#34)",
            digits=1,
        ),
        Row(
            "trickle: script calls per message (a send and an ack each, the rest fetches)",
            calls,
            "",
            "about 3",
            digits=2,
        ),
    ]


def bench_idle(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    progress("idle")
    probe.flushall()
    with WorkerProcesses(1, server.url, NOOP) as worker:
        result = idle.idle(worker, probe, args.idle_seconds)
    progress(f"  {result}")
    # The same idle, as run_delayqueue --processes 2 runs it: a supervisor and two workers.
    probe.flushall()
    with SupervisedWorkers(2, server.url, NOOP) as supervised:
        processes = idle.idle(supervised, probe, args.idle_seconds)
    progress(f"  --processes 2: {processes}")
    seconds = f"{args.idle_seconds:g} s"

    def sent(result: idle.Idle) -> str:
        return ", ".join(f"{name} {n}" for name, n in sorted(result.calls.items())) or "none"

    return [
        Row(
            f"idle worker, {seconds}: requests to Redis per second ({sent(result)})",
            [result.requests_per_second],
            "/s",
            "≤ 1/s",
            digits=2,
        ),
        Row(
            "idle worker: Redis commands per second, inside scripts included",
            [result.commands_per_second],
            "/s",
            "",
            digits=2,
        ),
        Row(f"idle worker: CPU time over {seconds}", [result.cpu_seconds], "s", "near 0", 2),
        Row(
            f"idle `--processes 2`, {seconds}: requests to Redis per second ({sent(processes)})",
            [processes.requests_per_second],
            "/s",
            "",
            digits=2,
        ),
        Row(
            f"idle `--processes 2`: CPU time over {seconds}, the supervisor and its 2 workers",
            [processes.cpu_seconds],
            "s",
            "",
            3,
        ),
    ]


def bench_scale(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    pending = args.scale_pending
    progress(f"scale: send latency empty, fill {pending:,}, send latency full, crowd")
    probe.flushall()
    empty = send.latencies_ms(args.latency_samples)
    probe.flushall()
    filled = scale.fill(pending, probe)
    memory = filled.memory
    progress(f"  {filled}")
    full = send.latencies_ms(args.latency_samples)
    with WorkerProcesses(1, server.url, NOOP):
        crowd = scale.crowd(args.scale_due, probe, filled.rate)
    progress(f"  {crowd}")
    slow = ", ".join(f"{name} {n}" for name, n in sorted(crowd.slow_calls.items()))
    structures = ", ".join(f"{part} {size:.0f} B" for part, size in memory.by_key.items())
    full_label = f"{pending:,}"
    return [
        Row("send() latency p50, empty queue", [statistics.median(empty)], "ms", "flat", 3),
        Row(
            f"send() latency p50, {full_label} pending", [statistics.median(full)], "ms", "flat", 3
        ),
        Row("send() latency p99, empty queue", [percentile(empty, 0.99)], "ms", "flat", 3),
        Row(f"send() latency p99, {full_label} pending", [percentile(full, 0.99)], "ms", "flat", 3),
        Row(
            f"longest single script call while filling to {full_label} (send_many, "
            "Redis latency tracking)",
            [filled.longest_send_ms],
            "ms",
            "≤ 5 ms",
            digits=2,
        ),
        Row(
            f"Redis memory per pending message beyond its {memory.payload_bytes:.0f}-byte "
            f"payload (MEMORY USAGE per message: {structures})",
            [memory.per_message],
            "bytes",
            "as low as the design allows",
        ),
        Row(
            f"{args.scale_due:,} due in the same second, {full_label} pending, 1 worker: "
            "last ack after the first due time",
            [crowd.seconds],
            "s",
            "all delivered",
            digits=2,
        ),
        Row(
            "meanwhile, the longest single script call (Redis latency tracking, "
            f"p99.9 {crowd.p999_call_ms:.2f} ms; calls over {scale.SLOW_CALL_MS} ms in "
            f"SLOWLOG: {slow or 'none'})",
            [crowd.longest_call_ms],
            "ms",
            "≤ 5 ms",
            digits=2,
        ),
    ]


def bench_outbox(args: argparse.Namespace, probe: Any, kind: str) -> list[Row]:
    progress(f"outbox and exactly once, on {kind}")
    outbox.migrate()
    probe.flushall()
    latency = outbox.send_latencies(args.latency_samples)

    def relay() -> float:
        probe.flushall()
        return outbox.relay_rate(args.relay_messages)

    def exactly_once() -> float:
        probe.flushall()
        return outbox.exactly_once_cost_us(args.exactly_once_messages)

    rates = repeat(args.runs, "relay", relay)
    costs = repeat(args.runs, "exactly-once cost", exactly_once)
    return outbox.rows(args, kind, rates, latency, costs)


def flushed(probe: Any, measure: Callable[[], T]) -> Callable[[], T]:
    """``measure``, on a Redis emptied first."""

    def run() -> T:
        probe.flushall()
        return measure()

    return run


def bench_kills(args: argparse.Namespace, server: RedisServer, probe: Any, kind: str) -> list[Row]:
    progress(f"kills: relays and EXACTLY_ONCE workers under kill -9, on {kind}")
    outbox.migrate()
    relays: dict[bool, list[kills.Pace]] = {}
    workers: dict[bool, list[kills.Pace]] = {}
    threads = kills.concurrency(kind)
    for killing in (False, True):
        what = "with kills" if killing else "no kills"
        relay = partial(kills.relay_pace, args.kill_messages, server.url, killing)
        handle = partial(kills.exactly_once_pace, args.kill_messages, server.url, killing, threads)
        relays[killing] = repeat(args.runs, f"relays, {what}", flushed(probe, relay))
        workers[killing] = repeat(
            args.runs, f"EXACTLY_ONCE workers, {what}", flushed(probe, handle)
        )
    return kills.rows(args, kind, relays, workers)


def bench_shards(args: argparse.Namespace) -> list[Row]:
    progress(f"shards: a private Redis Cluster of {args.masters} masters")
    cluster = RedisClusterServers(masters=args.masters)
    rows: list[Row] = []
    try:
        for layout in [int(n) for n in args.shards.split(",")]:
            options = {**settings.DELAYQUEUES["default"], "URL": cluster.url, "SHARDS": layout}
            with override_settings(DELAYQUEUES={"default": options}):
                rows += bench_layout(args, cluster, layout)
    finally:
        cluster.close()
    return rows


def bench_layout(args: argparse.Namespace, cluster: RedisClusterServers, layout: int) -> list[Row]:
    found = shards.masters(cluster, layout)
    placed = "; ".join(
        f"master {n} (slots {m.slots}): shards {', '.join(m.shards) or 'none'}"
        for n, m in enumerate(found, 1)
    )
    progress(f"SHARDS {layout}: {placed}")

    def single() -> shards.Split:
        cluster.flush()
        return shards.single_sends(args.send_messages, found)

    def bulk() -> shards.Split:
        cluster.flush()
        return shards.bulk_send(args.bulk_messages, found)

    try:
        singles = repeat(args.runs, "send()", single)
        bulks = repeat(args.runs, "send_many", bulk)
        workers = args.shard_workers
        env = {"DQ_BENCH_SHARDS": str(layout)}
        with WorkerProcesses(workers, cluster.url, NOOP, **env) as processes:
            drains = repeat(
                args.runs,
                "drain",
                lambda: shards.drain(args.drain_messages, cluster, found, processes.cpu_seconds),
            )
    finally:
        for master in found:
            master.client.close()
    return shards.rows(
        layout,
        found,
        workers=workers,
        bulk_messages=args.bulk_messages,
        drain_messages=args.drain_messages,
        singles=singles,
        bulks=bulks,
        drains=drains,
    )


def bench_peers(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    who = peers.contenders(server.url, peers.chosen_peers(args.peers))
    names = ", ".join(c.name.split()[0] for c in who)
    progress(f"peers: the trickle, then the burst of {args.burst_messages:,}, with {names}")
    measured: dict[str, list[lateness.Trickle]] = {c.name: [] for c in who}
    bursts: dict[str, list[send_burst.SendBurst]] = {c.name: [] for c in who}
    for run in range(args.runs):
        # Interleaved, so a change in the machine's load over the phase falls on all three.
        for contender in who:
            probe.flushall()
            trickle = contender.trickle(args.lateness_messages, args.lateness_spread, probe)
            measured[contender.name].append(trickle)
            progress(f"  {contender.name}, run {run + 1}/{args.runs}: {peers.summary(trickle)}")
    for run in range(args.runs):
        for contender in who:
            burst = contender.burst(args.burst_messages, probe)
            bursts[contender.name].append(burst)
            progress(f"  {contender.name}, burst, run {run + 1}/{args.runs}: {burst}")
    return [
        *peers.rows(args.lateness_messages, args.lateness_spread, who, measured),
        *send_burst.rows(args.burst_messages, [c.name for c in who], bursts),
    ]


def bench_async(args: argparse.Namespace, server: RedisServer, probe: Any) -> list[Row]:
    peers = io_burst.chosen_peers(args.async_peers)
    count, concurrency = args.io_messages, args.io_concurrency
    progress(f"async: an I/O-bound burst of {count:,}, ours on the loop and on threads, {peers}")
    who = io_burst.contenders(server.url, concurrency, peers, args.async_peers_python)
    measured: dict[str, list[io_burst.Burst]] = {c.name: [] for c in who}
    resting: list[float] = []
    for run in range(args.runs):
        # Interleaved, so a change in the machine's load over the phase falls on all of them.
        resting.append(io_burst.resting_rss_mb(server.url))
        progress(f"  a worker process at rest, run {run + 1}/{args.runs}: {resting[-1]:.0f} MiB")
        for contender in who:
            burst = contender.burst(count, probe)
            measured[contender.name].append(burst)
            progress(f"  {contender.name}, run {run + 1}/{args.runs}: {burst}")
    return io_burst.rows(count, concurrency, who, measured, resting)


def header(server: RedisServer, probe: Any) -> str:
    info = probe.info("server")
    # Valkey reports the Redis version it is compatible with as redis_version.
    name, version = (
        ("Valkey", info["valkey_version"])
        if "valkey_version" in info
        else ("Redis", info["redis_version"])
    )
    return (
        f"delayqueue_django benchmarks, {date.today()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, Django {django.get_version()}, "
        f"redis-py {redis.__version__} (hiredis {'on' if HIREDIS_AVAILABLE else 'off'}), "
        f"{name} {version} (private, port {server.port})"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    chosen = args.only.split(",")
    unknown = set(chosen) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown --only {', '.join(sorted(unknown))}; choose from {PHASES}")
    if "peers" in chosen:
        # Before any phase runs: huey and celery are an optional extra.
        peers.require(peers.chosen_peers(args.peers))
    if "async" in chosen:
        # The same for arq, saq and streaq, in a virtualenv of their own.
        io_burst.require(args.async_peers_python, io_burst.chosen_peers(args.async_peers))
    server = RedisServer()
    os.environ["DQ_BENCH_REDIS_URL"] = server.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    with contextlib.ExitStack() as stack:
        # The outbox's database, for this process only: the worker processes have none.
        with_database = "outbox" in chosen or "kills" in chosen
        kind = stack.enter_context(outbox.database()) if with_database else ""
        django.setup()
        os.environ.pop(outbox.DATABASE_ENV, None)
        run_phases(args, chosen, server, kind)


def run_phases(args: argparse.Namespace, chosen: list[str], server: RedisServer, kind: str) -> None:
    probe = server.client()
    started = time.monotonic()
    rows: list[Row] = []
    try:
        if "send" in chosen:
            rows += bench_send(args, probe)
        if "keys" in chosen:
            rows += bench_keys(args, probe)
        if "groups" in chosen:
            rows += bench_groups(args, probe)
        if "expiry" in chosen:
            rows += bench_expiry(args, probe)
        if "history" in chosen:
            rows += bench_history(args, probe)
        if "drain" in chosen:
            rows += bench_drain(args, server, probe)
        if "flow" in chosen:
            rows += bench_flow(args, server, probe)
        if "processes" in chosen:
            rows += bench_processes(args, server, probe)
        if "lateness" in chosen:
            rows += bench_lateness(args, server, probe)
        if "idle" in chosen:
            rows += bench_idle(args, server, probe)
        if "scale" in chosen:
            rows += bench_scale(args, server, probe)
        if "outbox" in chosen:
            rows += bench_outbox(args, probe, kind)
        if "kills" in chosen:
            rows += bench_kills(args, server, probe, kind)
        if "shards" in chosen:
            rows += bench_shards(args)
        if "peers" in chosen:
            rows += bench_peers(args, server, probe)
        if "async" in chosen:
            rows += bench_async(args, server, probe)
        print(header(server, probe))
        print()
        print(table(rows))
        progress(f"done in {time.monotonic() - started:.0f} s")
    finally:
        probe.close()
        server.close()
