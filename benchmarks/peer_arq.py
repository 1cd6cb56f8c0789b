"""arq's side of the I/O-bound burst (benchmarks/io_burst.py): a worker on the private Redis
with arq's defaults but ``max_jobs``, and one job that waits on I/O for 50 ms.

Its worker is arq's own command, run by the benchmark in the peers' virtualenv as
``python -m arq benchmarks.peer_arq.WorkerSettings --custom-log-dict
benchmarks.peer_arq.LOG_CONFIG`` (warnings only: by default arq logs two lines a job, which
ours does not). ``python -m benchmarks.peer_arq <count> <due_ms>`` sends the jobs.
"""

import asyncio
from datetime import UTC, datetime
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

from benchmarks.peer_io import (
    CONCURRENCY,
    IO_WAIT_SECONDS,
    REDIS_URL,
    in_batches,
    note_done,
    send_from_command_line,
)

# arq's queue: a sorted set of job ids by the time they are due, polled every poll_delay.
QUEUE = "arq:queue"


async def io_wait(ctx: dict[str, Any], n: int) -> None:
    await asyncio.sleep(IO_WAIT_SECONDS)
    note_done()


class WorkerSettings:
    # Otherwise arq's defaults: poll_delay 0.5 s, queue_read_limit max(5 x max_jobs, 100),
    # results kept for an hour (keep_result), health check every hour.
    functions = (io_wait,)
    redis_settings = RedisSettings.from_dsn(REDIS_URL)
    max_jobs = CONCURRENCY


LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"level": "WARNING", "class": "logging.StreamHandler"}},
    "loggers": {"arq": {"handlers": ["stderr"], "level": "WARNING"}},
}


async def send(count: int, due_ms: int) -> None:
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    at = datetime.fromtimestamp(due_ms / 1000, UTC) if due_ms else None
    await in_batches(lambda n: pool.enqueue_job("io_wait", n, _defer_until=at), count)
    await pool.aclose()


if __name__ == "__main__":
    send_from_command_line(send)
