"""streaq's side of the I/O-bound burst (benchmarks/io_burst.py): a worker on the private
Redis with streaq's defaults but ``concurrency``, and one task that waits on I/O for 50 ms.

``python -m benchmarks.peer_streaq`` runs the worker as streaq's command would
(``Worker.run_sync``), with warnings only: the command logs two lines a task at INFO and has
no option to say less. ``python -m benchmarks.peer_streaq <count> <due_ms>`` sends the tasks
(in one pipeline, streaq's ``enqueue_many``).
"""

import asyncio
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from streaq import Worker

from benchmarks.peer_io import (
    CONCURRENCY,
    IO_WAIT_SECONDS,
    REDIS_URL,
    note_done,
    send_from_command_line,
)

# streaq keeps a delayed task in a sorted set (moved to the stream when due, by a timer every
# 0.5 s), and a due one in a stream, deleted from it (XACK, XDEL) when it is done.
NAME = "peers"
DELAYED = f"streaq:{NAME}:queues:delayed:normal"
STREAM = f"streaq:{NAME}:queues:normal"

# Otherwise streaq's defaults: prefetch as much again as the concurrency, results kept 5
# minutes.
worker = Worker(redis_url=REDIS_URL, concurrency=CONCURRENCY, queue_name=NAME)


async def _io_wait(n: int) -> None:
    await asyncio.sleep(IO_WAIT_SECONDS)
    note_done()


# Registered by call, not with @worker.task(): streaq is not installed where mypy runs.
io_wait: Any = worker.task()(_io_wait)


async def send(count: int, due_ms: int) -> None:
    at = datetime.fromtimestamp(due_ms / 1000, UTC) if due_ms else None
    tasks = [io_wait.enqueue(n).start(schedule=at) for n in range(count)]
    async with worker:
        await worker.enqueue_many(tasks)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        send_from_command_line(send)
    else:
        logging.basicConfig(level=logging.WARNING)
        worker.run_sync()
