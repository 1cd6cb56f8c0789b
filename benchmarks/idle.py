"""Idle cost: what one worker with nothing to do asks of Redis and of the CPU, and the same
for a supervised command (``run_delayqueue --processes``: the supervisor and its children)."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.probes import Monitored
from benchmarks.workers import WorkerProcesses, cpu_seconds


@dataclass(frozen=True)
class Idle:
    requests_per_second: float  # commands the worker sent (round trips)
    commands_per_second: float  # the same plus the commands run inside its scripts
    cpu_seconds: float  # the worker's CPU time over the whole window
    seconds: float
    requests: dict[str, int]  # what it sent, by command
    # The same, a function call named by its function ("fcall fetch"): which duty sent it.
    calls: dict[str, int]


def process_tree_cpu(pid: int) -> float:
    """CPU time so far of a process and of its children, recursively (Linux /proc)."""
    total = cpu_seconds(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        total += sum(process_tree_cpu(int(child)) for child in children.read_text().split())
    return total


def idle(worker: WorkerProcesses, probe_client: Any, seconds: float) -> Idle:
    """Watch a started worker on an empty queue for ``seconds`` (MONITOR sees every command,
    the worker's and those its scripts run). Its processes' children count too: a supervised
    command's worker processes."""

    def cpu() -> float:
        return sum(process_tree_cpu(process.pid) for process in worker.processes)

    time.sleep(1.0)  # past its start-up
    cpu_before = cpu()
    with Monitored(probe_client) as monitored:
        time.sleep(seconds)
    used = cpu() - cpu_before
    requests = sum(monitored.client_commands.values())
    return Idle(
        requests_per_second=requests / seconds,
        commands_per_second=(requests + sum(monitored.script_commands.values())) / seconds,
        cpu_seconds=used,
        seconds=seconds,
        requests=dict(monitored.client_commands),
        calls=dict(monitored.client_calls),
    )
