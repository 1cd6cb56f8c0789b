"""A fleet of ``manage.py run_delayqueue`` processes that a chaos test can kill and restart.

Each process logs to its own file in the fleet's folder, shown when a test fails.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from tests.chaos.ledger import LEDGER_ENV

ROOT = Path(__file__).resolve().parent.parent.parent


class WorkerFleet:
    def __init__(
        self,
        folder: Path,
        chaos_settings: dict[str, Any],
        *worker_args: str,
        size: int = 2,
        command: str = "run_delayqueue",
    ) -> None:
        self.folder = folder
        self.ledger = folder / "ledger"
        self.ledger.mkdir(parents=True, exist_ok=True)
        self.logs = folder / "logs"
        self.logs.mkdir(exist_ok=True)
        self.environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "DQ_CHAOS_SETTINGS": json.dumps(chaos_settings),
            LEDGER_ENV: str(self.ledger),
            "PYTHONPATH": str(ROOT),
        }
        self.worker_args = worker_args
        self.size = size
        self.command = command  # or delayqueue_relay: a fleet of relays
        self.running: list[subprocess.Popen[bytes]] = []
        self.killed: dict[int, float] = {}  # pid -> time.time() of its kill -9
        self.exited: dict[int, int] = {}  # pid -> exit code, for those stopped by the fleet
        self._log_files: list[IO[bytes]] = []
        self._log_paths: dict[int, Path] = {}

    def start(self) -> None:
        while len(self.running) < self.size:
            self.running.append(self._spawn())

    def _spawn(self) -> "subprocess.Popen[bytes]":
        path = self.logs / f"worker-{len(self._log_files)}.log"
        log = open(path, "wb")  # noqa: SIM115  (closed by close())
        self._log_files.append(log)
        process = subprocess.Popen(
            [sys.executable, "-m", "django", self.command, "-v", "1", *self.worker_args],
            env=self.environment,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self._log_paths[process.pid] = path
        return process

    def wait_started(self, timeout: float = 30) -> None:
        """Until every running worker printed its banner: its signal handlers are then about
        to be installed (a SIGTERM before that would end it with -15, not a graceful 0)."""
        deadline = time.monotonic() + timeout
        while not all(map(self._started, self.running)):
            self._check_starting(deadline)
        time.sleep(0.3)

    def _started(self, process: "subprocess.Popen[bytes]") -> bool:
        return "queue 'default'" in self._log_paths[process.pid].read_text(errors="replace")

    def _check_starting(self, deadline: float) -> None:
        for process in self.running:
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"worker {process.pid} did not start:\n{self.output()}")
        time.sleep(0.05)

    def kill_one(self, rng: random.Random) -> int:
        """``kill -9`` a random worker among those that have started, and start a new one in
        its place; returns the pid. Only started ones: on a loaded machine, where starting
        Django takes longer than the scenarios' pauses between kills, the replacements would
        otherwise be killed before they fetch anything, and the queue would never drain."""
        deadline = time.monotonic() + 30
        while not (started := [process for process in self.running if self._started(process)]):
            self._check_starting(deadline)
        victim = rng.choice(started)
        self.running.remove(victim)
        victim.send_signal(signal.SIGKILL)
        self.killed[victim.pid] = time.time()
        victim.wait(timeout=10)
        self.running.append(self._spawn())
        return victim.pid

    def stop(self, timeout: float = 30) -> dict[int, int]:
        """SIGTERM every worker and wait; returns each one's exit code (-9 if it had to be
        killed after ``timeout``)."""
        self.wait_started()
        for process in self.running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.running:
            try:
                self.exited[process.pid] = process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                process.kill()
                self.exited[process.pid] = process.wait()
        self.running = []
        return dict(self.exited)

    def close(self) -> None:
        for process in self.running:
            process.kill()
            process.wait()
        self.running = []
        for log in self._log_files:
            log.close()

    def output(self, last_lines: int = 40) -> str:
        """The end of every worker's log, for failure messages."""
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-last_lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def log_text(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.logs.glob("*.log"))
