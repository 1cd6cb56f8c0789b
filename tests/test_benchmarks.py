"""The benchmark suite runs (at a tiny size). Its figures are never checked here: they
depend on the machine; ``make bench`` is for reading them."""

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks.flow import COST_OPTIONS, SHARDED_PLAIN, SHARDS
from benchmarks.run import PHASES

ROOT = Path(__file__).resolve().parent.parent


def figure(table: list[str], measure_starts: str) -> float:
    """The median of the row whose measure starts so."""
    [row] = [line for line in table if line.startswith(f"| {measure_starts}")]
    return float(row.split(" | ")[1].split()[0].replace(",", ""))


def run_quick(*phases: str, options: Sequence[str] = ()) -> tuple[str, list[str]]:
    """``python -m benchmarks --quick --only <phases> <options>``: its output and its table's
    lines."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", ",".join(phases), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, [line for line in result.stdout.splitlines() if line.startswith("| ")]


@pytest.mark.timeout(60)
def test_the_benchmark_suite_runs_and_prints_its_table() -> None:
    # Every benchmark but the shards', which starts a cluster of its own (the test below), the
    # kills', which starts and kills relay and worker processes (the test after it), and
    # the peers', which runs huey and celery: they come with the optional peers extra, which
    # the test environment (and so CI) does not install, and this suite skips no test. The
    # async phase runs arq, saq and streaq from a virtualenv of their own, which neither has:
    # its test below runs ours only. The keys', flow gates', groups', processes', expiry's
    # and attempt records' have tests of their own too.
    skipped = (
        "shards",
        "peers",
        "async",
        "kills",
        "keys",
        "flow",
        "groups",
        "processes",
        "expiry",
        "history",
    )
    stdout, table = run_quick(*(phase for phase in PHASES if phase not in skipped))
    assert table[0] == "| measure | median (min-max over runs) | target |"
    measures = "\n".join(table)
    for measure in (
        "send(), one call per message",
        "send(), one call per message: the producer's CPU per call",
        "asend(), one call per message, on redis.asyncio: the producer's CPU per call",
        "send_many",
        "drain 500 due together, 1 worker process",
        "Redis commands per handled message",
        "Redis CPU per message, 500 due together",
        "lateness",
        "idle worker",
        "idle `--processes 2`",
        "send() latency p99, 2,000 pending",
        "Redis memory per pending message",
        "500 due in the same second",
        "longest single script call",
        "send(outbox=True) in a transaction",
        "outbox relay, one relay, 2,000 rows",
        "EXACTLY_ONCE: added per handled message",
    ):
        assert measure in measures
    assert "cores" in stdout
    # What a message costs Redis is never nothing, whether the store calls scripts or
    # functions: at least its send and its fetch.
    assert figure(table, "trickle, the same 20 messages (send + wake-up + fetch + ack") > 0
    assert figure(table, "trickle: Redis time in script calls per message") > 0
    assert figure(table, "trickle: Redis commands per message, inside scripts included") >= 2
    assert figure(table, "Redis CPU per message, 500 due together") > 0
    # The floor under the trickle: a bare PING at its pace costs the server something too.
    assert figure(table, "trickle's floor: Redis CPU per bare PING sent at the same pace") > 0


@pytest.mark.timeout(60)
def test_the_groups_benchmark_sets_grouped_messages_beside_plain_ones() -> None:
    stdout, table = run_quick("groups")
    assert "cores" in stdout
    for mode in (
        "plain (no group)",
        "grouped, spread over 100 groups",
        "grouped, all in one group",
    ):
        redis_time = "send_many + drain of 500: Redis time per message in its script calls"
        assert figure(table, f"{redis_time} (INFO commandstats), {mode}") > 0
        assert figure(table, f"send_many + drain of 500 in one process, {mode}") > 0


def test_the_processes_benchmark_sets_one_supervised_command_beside_separate_ones() -> None:
    _, table = run_quick("processes")
    one = figure(table, "drain 500 due together, 1 worker process, one command --processes 1")
    separate = figure(table, "drain 500 due together, 1 worker process, 1 separate commands")
    ratio = figure(table, "drain 500 due together, 1 worker process: one command's rate")
    assert one > 0
    assert separate > 0
    assert ratio == pytest.approx(one / separate, abs=0.01)
    # Where the CPU went, process by process, from the due time to the last ack.
    cpu = "CPU per message, drain 500 due together, 1 worker process, one command --processes 1"
    assert figure(table, f"{cpu}, due time to last ack: the worker processes") > 0
    assert figure(table, f"{cpu}, due time to last ack: Redis") > 0
    assert figure(table, f"{cpu}, due time to last ack: the benchmark's process") > 0
    assert figure(table, f"{cpu}, due time to last ack: those processes' CPU") > 0


@pytest.mark.timeout(60)
def test_the_keys_benchmark_sets_keyed_sends_beside_plain_ones_and_sees_holds_reclaimed() -> None:
    stdout, table = run_quick("keys")
    assert "cores" in stdout
    for what, count in (("send(), one call per message", "200"), ("send_many", "1,000")):
        for mode in (
            "plain (no key)",
            "a new key each (if_exists keep)",
            "one key, replaced each time (if_exists replace)",
        ):
            assert figure(table, f"{what}, {count} messages: {mode}") > 0
        for mode in ("a new key each (if_exists keep)", "one key, replaced each time"):
            assert figure(table, f"{what}: {mode}") > 0  # the ratio to plain
    redis_time = "send_many: Redis time per message in its script calls (INFO commandstats)"
    for mode in ("plain (no key)", "a new key each (if_exists keep)"):
        assert figure(table, f"{redis_time}, {mode}") > 0
    # A key costs memory in the index and in its message's stored body; a hold is a
    # string of its own.
    assert figure(table, "Redis bytes per key held: the keys hash") > 0
    assert figure(table, "Redis bytes per key held: a keyed message's payload entry") > 0
    assert figure(table, "Redis bytes per unique_for hold string") > 0
    held = "2,000 keys with unique_for=0.2 s (send_many)"
    assert figure(table, f"{held}: sent") > 0
    assert 0 <= figure(table, f"{held}: holds still in Redis when the sends returned") <= 2_000
    assert figure(table, f"{held}: every hold gone") >= 0
    # The holds' memory came back: the bench waited until Redis had expired every one.
    assert figure(table, f"{held}: Redis memory freed by the expiry, per hold") > 0


@pytest.mark.timeout(60)
def test_the_shards_benchmark_runs_on_a_cluster_and_splits_the_cpu_by_master() -> None:
    stdout, table = run_quick("shards")
    assert table[0] == "| measure | median (min-max over runs) | target |"
    assert "cores" in stdout
    # Where the queue's shards fall is fixed by their tags: evenly over the 3 masters.
    placed = {
        1: ["shards 0", "shards none", "shards none"],
        3: ["shards 0", "shards 3.1", "shards 3.2"],
        6: ["shards 0, 6.5", "shards 6.1, 6.2", "shards 6.3, 6.4"],
    }
    for layout, shards in placed.items():
        what = f"SHARDS {layout} on 3 masters"
        for measure in (
            "send(), one call per message, one process",
            "send_many, 1,000 messages",
            "drain 500 due together, 1 worker process",
        ):
            assert figure(table, f"{what}: {measure}") > 0
        assert figure(table, f"{what}: Redis CPU per send(), all masters") > 0
        total = figure(table, f"{what}: Redis CPU per message in the drain, all masters")
        assert total > 0
        masters = [line for line in table if line.startswith(f"| {what}: Redis CPU per message on")]
        assert len(masters) == 3
        shares = []
        for number, (line, shard_names) in enumerate(zip(masters, shards, strict=True), 1):
            assert f"master {number} (slots " in line
            assert f"; {shard_names}), in the drain" in line
            used = line.split(" | ")[1]
            shares.append(float(used.split("; ")[1].removesuffix("% of all masters'")))
        # Rounded to whole percents, the shares still add up to about all of it.
        assert 97 <= sum(shares) <= 103
        assert f"| {what}: the worker processes' CPU per message in the drain |" in stdout


@pytest.mark.timeout(60)
def test_the_kills_benchmark_paces_relays_and_workers_with_and_without_kills() -> None:
    stdout, table = run_quick("kills")
    assert table[0] == "| measure | median (min-max over runs) | target |"
    assert "cores" in stdout
    for what in (
        "outbox relay, 3 relays (batches of 20), 300 rows",
        "EXACTLY_ONCE, 3 workers (--concurrency",
    ):
        rows = [line for line in table if line.startswith(f"| {what}")]
        assert len(rows) == 2
        assert ": no kills |" in rows[0]
        assert ": one kill -9 every 0.5 s" in rows[1]
        for row in rows:
            assert float(row.split(" | ")[1].split()[0].replace(",", "")) > 0, row


@pytest.mark.timeout(60)
def test_the_flow_benchmark_reports_the_rate_reached_and_the_gates_cost() -> None:
    _, table = run_quick("flow")
    # The limit holds over the drain: never above it (2 s at 200/s, from the due time).
    accuracy = figure(table, "drain 400 due together under RATE_LIMIT 200/s")
    assert 0 < accuracy <= 100
    for name in COST_OPTIONS:
        assert figure(table, f"Redis time per handled message, {name}") > 0
        assert figure(table, f"Redis commands per handled message, {name}") > 0
    # A sharded queue's gates cost round trips to shard 0 (engine.flow); a plain one's none.
    calls = {
        name: figure(table, f"script calls (round trips) per handled message, {name}")
        for name in COST_OPTIONS
    }
    assert calls[f"SHARDS {SHARDS}, MAX_IN_FLIGHT (not binding)"] > calls[SHARDED_PLAIN]


def test_the_expiry_benchmark_sets_expiring_messages_beside_plain_ones() -> None:
    _, table = run_quick("expiry")
    what = "1,000 messages sent, fetched and acked in this process"
    for mode in (
        "plain (no expiry)",
        "with an expiry, handled before it",
        "expired before its fetch (dead-lettered by the fetch)",
    ):
        redis_time = f"{what}: Redis time per message in script calls (INFO commandstats)"
        assert figure(table, f"{redis_time}, {mode}") > 0
    assert figure(table, f"{what}: with an expiry, handled before it ÷ plain") > 0


@pytest.mark.timeout(60)
def test_the_async_benchmark_sets_the_event_loop_beside_threads() -> None:
    # Ours only: the peers' virtualenv is make bench's, not the tests'.
    _, table = run_quick("async", options=["--async-peers", ""])
    what = "I/O-bound burst, 200 due together, handler waits 50 ms, 1 worker process"
    on_loop = figure(table, f"{what}: throughput — delayqueue_django, async def handler")
    threads = figure(table, f"{what}: throughput — delayqueue_django, sync handler")
    assert on_loop > 0
    assert threads > 0
    ratio = figure(table, f"{what}: async handler's throughput ÷ 100 threads'")
    assert ratio == pytest.approx(on_loop / threads, rel=0.02)
    assert not [line for line in table if "÷ the best async peer" in line]
    resting = figure(table, "for comparison: the peak RSS of a run_delayqueue process at rest")
    for name in ("async def handler", "sync handler"):
        ours = f"delayqueue_django, {name}"
        # A process that ran 100 handlers at once holds at least what one at rest holds.
        peak = figure(table, f"{what}: the worker process's peak RSS (VmHWM) — {ours}")
        assert peak > resting / 2
        # Every message is fetched and acked: some script calls, far fewer than one each.
        calls = figure(table, f"{what}: script calls (round trips) per message — {ours}")
        assert 0 < calls < 1


@pytest.mark.timeout(60)
def test_the_peers_benchmark_sets_the_burst_beside_the_trickle() -> None:
    # Ours only: huey and celery come with the optional peers extra, which the tests'
    # environment does not install (make bench runs them).
    stdout, table = run_quick("peers", options=["--peers", ""])
    assert "cores" in stdout
    trickle = "peers, trickle of 20 over 0.5 s"
    assert figure(table, f"{trickle}: lateness p99 — delayqueue_django") > 0
    what = (
        "peers, burst of 300 due at one instant, sent one call each, then drained by 1 worker "
        "process at concurrency 1"
    )
    for measure in (
        "send rate, one call per message",
        "the producer's CPU per send (process time)",
        "drain rate, due time to the last handler's start",
    ):
        assert figure(table, f"{what}: {measure} — delayqueue_django") > 0
    # The ratios need huey in the same run.
    assert not [line for line in table if "ours ÷ huey's" in line]


def test_the_history_benchmark_counts_commands_and_bytes_of_attempt_records() -> None:
    _, table = run_quick("history")
    what = "attempt records, 200 messages in batches of 100"
    assert figure(table, f"{what}: Redis commands per ack of a message that never failed") > 0
    assert figure(table, f"{what}: Redis commands per nack, its attempt record written") > 0
    assert 0 < figure(table, "Redis bytes per attempt record, a usual failure") < 2_000
    bounded = figure(table, "Redis bytes per attempt record, text and traceback at their bounds")
    assert 10_000 < bounded <= 13 * 1024
