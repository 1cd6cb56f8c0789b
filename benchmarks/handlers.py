"""Handlers the benchmark's worker processes run."""

import asyncio
import os
import time
from typing import TextIO

from benchmarks.peer_io import IO_WAIT_SECONDS
from delayqueue_django.core.message import Message


def noop(message: Message) -> None:
    """Does nothing: the drain measures the queue, not the handler."""


async def io_wait(message: Message) -> None:
    """Waits on I/O (an HTTP call, say) without holding a thread: the I/O-bound burst's
    async handler (benchmarks/io_burst.py), run on the worker's event loop."""
    await asyncio.sleep(IO_WAIT_SECONDS)


def io_wait_in_thread(message: Message) -> None:
    """The same wait in a sync handler: it holds its handler thread throughout."""
    time.sleep(IO_WAIT_SECONDS)


# One line per message, "<ms late>", appended as each handler starts (file named by
# DQ_BENCH_LATENESS_FILE); written after the clock is read, so the write is not measured.
_lateness_file: TextIO | None = None


def record_lateness(message: Message) -> None:
    """How late this handler started: the local clock minus the message's due time.

    The due time (``payload["due_ms"]``) was given to ``send(at=...)``, so it is exact; Redis
    and this process read the same machine's clock.
    """
    note_lateness(message.payload["due_ms"])


def note_lateness(due_ms: float) -> None:
    """Append how late it is now, after ``due_ms`` (ms since the epoch), to the lateness file:
    the one record every worker of the trickle writes, ours and the peers' (benchmarks/peers)."""
    late_ms = time.time() * 1000 - due_ms
    global _lateness_file
    if _lateness_file is None:
        _lateness_file = open(os.environ["DQ_BENCH_LATENESS_FILE"], "a", buffering=1)  # noqa: SIM115
    _lateness_file.write(f"{late_ms:.3f}\n")
