"""Worker processes for the benchmark: real ``manage.py run_delayqueue`` subprocesses."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from delayqueue_django import get_queue
from delayqueue_django.worker.heartbeat import live_workers

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    """User + system CPU time used so far by the process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def on_cpu_seconds(pid: int) -> float:
    """The time the process's live threads have spent on a CPU so far (Linux schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread gone meanwhile
    return total / 1e9


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == pid:
            found.append(int(entry.name))
    return found


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far, in MiB (VmHWM, Linux /proc): all its
    threads' stacks and heaps included."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


class WorkerProcesses:
    """``count`` worker processes on the benchmark's queue, started and ready on entry
    (each has published its heartbeat, so it listens for wake-ups), stopped on exit."""

    def __init__(
        self, count: int, redis_url: str, handler: str, *arguments: str, **env: str
    ) -> None:
        self.count = count
        # The heartbeats that say they are all ready (see SupervisedWorkers).
        self.heartbeats = count
        # The workers' output, for the error when one fails; closed by stop().
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
            "DQ_BENCH_REDIS_URL": redis_url,
            "DQ_BENCH_HANDLER": handler,
            "PYTHONPATH": str(ROOT),
            **env,
        }
        command = [sys.executable, "-m", "django", "run_delayqueue", "-v", "0", *arguments]
        self.processes = [
            subprocess.Popen(command, env=environment, cwd=ROOT, stdout=self._log, stderr=self._log)
            for _ in range(count)
        ]

    def __enter__(self) -> "WorkerProcesses":
        deadline = time.monotonic() + 60
        while len(live_workers(get_queue())) < self.heartbeats:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start within 60 s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a worker exited with {process.returncode}:\n{self.log()}")

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by all the worker processes (Linux /proc)."""
        return sum(cpu_seconds(process.pid) for process in self.processes)

    def tree_cpu_seconds(self) -> float:
        """The CPU time used so far by the processes started and those a supervisor started
        (--processes: theirs count in its own figures only once they end), to the
        nanosecond: each thread's time on a CPU (schedstat), where /proc's user and system
        times count in clock ticks (10 ms, as much as a short drain's whole share)."""
        pids = [process.pid for process in self.processes]
        return sum(on_cpu_seconds(pid) for pid in pids + [c for p in pids for c in children(p)])

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()


class SupervisedWorkers(WorkerProcesses):
    """``processes`` worker processes started by one command, ``run_delayqueue --processes``:
    ready once they and their supervisor have published their heartbeats."""

    def __init__(self, processes: int, redis_url: str, handler: str, *arguments: str) -> None:
        super().__init__(1, redis_url, handler, "--processes", str(processes), *arguments)
        self.heartbeats = processes + 1
