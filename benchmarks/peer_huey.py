"""huey's side of the peers benchmark (benchmarks/peers.py): a ``RedisHuey`` on the private
Redis with huey's defaults, and one task that records how late it started.

Its consumer is huey's own command, run by the benchmark as
``python -m huey.bin.huey_consumer benchmarks.peer_huey.huey -w 1 -k thread`` (one worker
thread; the scheduler's default interval, 1 s).
"""

import os
from typing import Any

from huey import RedisHuey

from benchmarks.handlers import note_lateness

# huey's defaults otherwise: results kept (a task returning None stores none), utc=True, a
# blocking BRPOP with a 1 s read timeout. Its keys: huey.redis.peers (the queue, a list) and
# huey.schedule.peers (tasks not yet due, a sorted set).
NAME = "peers"
huey = RedisHuey(NAME, url=os.environ.get("DQ_BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))


def _record_lateness(due_ms: int) -> None:
    note_lateness(due_ms)


# Registered by call, not with @huey.task(): huey has no type hints, and the decorator would
# make the function untyped for mypy.
record_lateness: Any = huey.task()(_record_lateness)
