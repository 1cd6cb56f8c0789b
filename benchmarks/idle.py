"""Idle cost: what one worker with nothing to do asks of Redis and of the CPU."""

import time
from dataclasses import dataclass
from typing import Any

from benchmarks.probes import Monitored
from benchmarks.workers import WorkerProcesses


@dataclass(frozen=True)
class Idle:
    requests_per_second: float  # commands the worker sent (round trips)
    commands_per_second: float  # the same plus the commands run inside its scripts
    cpu_seconds: float  # the worker's CPU time over the whole window
    seconds: float
    requests: dict[str, int]  # what it sent, by command


def idle(worker: WorkerProcesses, probe_client: Any, seconds: float) -> Idle:
    """Watch a started worker on an empty queue for ``seconds`` (MONITOR sees every command,
    the worker's and those its scripts run)."""
    time.sleep(1.0)  # past its start-up
    cpu_before = worker.cpu_seconds()
    with Monitored(probe_client) as monitored:
        time.sleep(seconds)
    cpu = worker.cpu_seconds() - cpu_before
    requests = sum(monitored.client_commands.values())
    return Idle(
        requests_per_second=requests / seconds,
        commands_per_second=(requests + sum(monitored.script_commands.values())) / seconds,
        cpu_seconds=cpu,
        seconds=seconds,
        requests=dict(monitored.client_commands),
    )
