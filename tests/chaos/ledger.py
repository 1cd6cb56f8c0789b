"""What chaos workers did, kept outside the Redis under test so that no fault can touch it.

Each worker process appends one line per event to its own file, with one ``os.write`` per
line (O_APPEND): a line is in the kernel before the handler returns, so a ``kill -9`` loses
nothing that was recorded, and the test reads every file afterwards.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path

LEDGER_ENV = "DQ_CHAOS_LEDGER"

_fd: int | None = None
_fd_pid: int | None = None


def _file() -> int:
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:
        path = Path(os.environ[LEDGER_ENV]) / f"{pid}.log"
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fd_pid = pid
    return _fd


def record(event: str, message_id: str, attempt: int) -> None:
    """``event``: "start" when a handler begins, "done" when it is about to return success."""
    line = f"{event} {message_id} {attempt} {os.getpid()} {time.time():.6f}\n"
    os.write(_file(), line.encode())


@dataclass(frozen=True, slots=True)
class Entry:
    event: str
    id: str
    attempt: int
    pid: int
    time: float


def read(folder: Path) -> list[Entry]:
    """Every complete line of every worker's file, in time order."""
    entries = []
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                event, message_id, attempt, pid, at = parts
                entries.append(Entry(event, message_id, int(attempt), int(pid), float(at)))
    entries.sort(key=lambda entry: entry.time)
    return entries
