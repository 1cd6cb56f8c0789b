"""What the async peers of the I/O-bound burst share (benchmarks/io_burst.py): the wait each
handler makes, the record of what finished, and the command line that sends their jobs.

Standard library only: these modules run in the peers' own virtualenv (arq needs a
redis-py older than this project's; see io_burst.py), where Django is not needed.
"""

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TextIO

# What every handler of the burst does: wait on I/O for 50 ms (ours and the peers' alike).
IO_WAIT_SECONDS = 0.05

# The peers' side of the options: the private Redis and the concurrency setting.
REDIS_URL = os.environ.get("DQ_BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
CONCURRENCY = int(os.environ.get("DQ_BENCH_IO_CONCURRENCY", "1000"))

_done_file: TextIO | None = None


def note_done() -> None:
    """Append a line to the file named by DQ_BENCH_DONE_FILE: one per handler that ran to
    its end, so the benchmark can tell that every job ran, not only that the peer's keys
    emptied."""
    global _done_file
    if _done_file is None:
        _done_file = open(os.environ["DQ_BENCH_DONE_FILE"], "a", buffering=1)  # noqa: SIM115
    _done_file.write("1\n")


Sender = Callable[[int, int], Coroutine[Any, Any, None]]  # (count, due ms)


async def in_batches(send_one: Callable[[int], Awaitable[Any]], count: int) -> None:
    """``send_one(n)`` for n in range(count), a hundred at a time: a peer with no bulk send
    still sends 5,000 jobs well within the benchmark's lead time."""
    for start in range(0, count, 100):
        await asyncio.gather(*(send_one(n) for n in range(start, min(start + 100, count))))


def send_from_command_line(send: Sender) -> None:
    """``python -m benchmarks.peer_<name> <count> <due_ms>``: send ``count`` jobs due at
    ``due_ms`` (ms since the epoch; 0: due now) to the peer's queue on the private Redis."""
    count, due_ms = (int(word) for word in sys.argv[1:3])
    asyncio.run(send(count, due_ms))
