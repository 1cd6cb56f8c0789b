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


def unmet_by_a_fresh_process(limit_mb: float) -> str | None:
    """Why ``--max-memory limit_mb`` cannot work, or None. This process (the supervisor,
    with the settings and handlers loaded as each worker process loads them) is a fresh
    worker process's size, or less: a limit it passes already, every worker process would
    pass before its first message, and be replaced at once, for ever."""
    own = resident_mb(os.getpid())
    if own is None or own < limit_mb:
        return None
    return (
        f"--max-memory {limit_mb:g} is below what a fresh worker process holds: this "
        f"supervisor, with the same code loaded, holds {own:.0f} MB already, and each worker "
        "process holds at least as much before its first message, so it would be replaced "
        "as soon as it started. Give a limit in MB above that, with room for what the "
        "handlers use."
    )
