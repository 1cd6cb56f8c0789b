"""How much memory a process holds now (its resident set), for ``--max-memory``."""

import os
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def can_measure() -> bool:
    """Whether this system shows other processes' resident sets (Linux's /proc)."""
    return Path("/proc/self/statm").exists()


def resident_mb(pid: int) -> float | None:
    """The process's resident set in MB (2**20 bytes), or None if it is gone or cannot be
    read."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * PAGE_BYTES / 2**20
