"""The benchmark suite runs (at a tiny size). Its figures are never checked here: they
depend on the machine; ``make bench`` is for reading them."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def figure(table: list[str], measure_starts: str) -> float:
    """The median of the row whose measure starts so."""
    [row] = [line for line in table if line.startswith(f"| {measure_starts}")]
    return float(row.split(" | ")[1].split()[0].replace(",", ""))


@pytest.mark.timeout(60)
def test_the_benchmark_suite_runs_and_prints_its_table() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| measure | median (min-max over runs) | target |"
    measures = "\n".join(table)
    for measure in (
        "send(), one call per message",
        "send_many",
        "drain 500 due together, 1 worker process",
        "Redis commands per handled message",
        "Redis CPU per message, 500 due together",
        "lateness",
        "idle worker",
        "send() latency p99, 2,000 pending",
        "Redis memory per pending message",
        "500 due in the same second",
        "longest single script call",
        "send(outbox=True) in a transaction",
        "outbox relay, one relay, 2,000 rows",
        "EXACTLY_ONCE: added per handled message",
    ):
        assert measure in measures
    assert "cores" in result.stdout
    # What a message costs Redis is never nothing, whether the store calls scripts or
    # functions: at least its send and its fetch.
    assert figure(table, "trickle, the same 20 messages (send + wake-up + fetch + ack") > 0
    assert figure(table, "trickle: Redis time in script calls per message") > 0
    assert figure(table, "trickle: Redis commands per message, inside scripts included") >= 2
    assert figure(table, "Redis CPU per message, 500 due together") > 0
