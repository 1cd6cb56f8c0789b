"""saq's side of the I/O-bound burst (benchmarks/io_burst.py): a worker on the private Redis
with saq's defaults but ``concurrency``, and one job that waits on I/O for 50 ms.

Its worker is saq's own command, run by the benchmark in the peers' virtualenv as
``python -m saq benchmarks.peer_saq.settings`` (one process; warnings only, saq's default).
``python -m benchmarks.peer_saq <count> <due_ms>`` sends the jobs.
"""

import asyncio
from typing import Any

from saq import Queue

from benchmarks.peer_io import (
    CONCURRENCY,
    IO_WAIT_SECONDS,
    REDIS_URL,
    in_batches,
    note_done,
    send_from_command_line,
)

# saq keeps a job not finished in saq:<name>:incomplete (a sorted set, by due time), and its
# id in the queued list once due (moved there by the worker's schedule timer, every second),
# then in the active list while it runs.
NAME = "peers"
KEYS = {"incomplete": f"saq:{NAME}:incomplete", "queued": f"saq:{NAME}:queued"}
ACTIVE = f"saq:{NAME}:active"


async def io_wait(ctx: dict[str, Any], *, n: int) -> None:
    await asyncio.sleep(IO_WAIT_SECONDS)
    note_done()


def settings() -> dict[str, Any]:
    """Called by saq's worker command in its own process (its queue connects there)."""
    # Otherwise saq's defaults: the schedule timer every 1 s, dequeue_timeout 0 (a blocking
    # BLMOVE per free slot).
    return {
        "queue": Queue.from_url(REDIS_URL, name=NAME),
        "functions": [io_wait],
        "concurrency": CONCURRENCY,
    }


async def send(count: int, due_ms: int) -> None:
    queue = Queue.from_url(REDIS_URL, name=NAME)
    await queue.connect()
    # 0, not 0.0: saq queues a job at once only when its scheduled time reads "0".
    scheduled = due_ms / 1000 if due_ms else 0
    await in_batches(lambda n: queue.enqueue("io_wait", n=n, scheduled=scheduled), count)
    await queue.disconnect()


if __name__ == "__main__":
    send_from_command_line(send)
