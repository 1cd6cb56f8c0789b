"""celery's side of the peers benchmark (benchmarks/peers.py): a Celery app whose broker is
the private Redis, with no result backend, and one task that records how late it started.

Its worker is celery's own command, run by the benchmark as
``celery -A benchmarks.peer_celery worker -P solo -c 1 --without-gossip --without-mingle
--without-heartbeat -Q peers``.
"""

import os
from typing import Any

from celery import Celery

from benchmarks.handlers import note_lateness

QUEUE = "peers"

app = Celery("peer_celery")
app.conf.update(
    broker_url=os.environ.get("DQ_BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
    task_default_queue=QUEUE,
    # What celery 5 does anyway; said, so the worker does not print its deprecation notice.
    broker_connection_retry_on_startup=True,
)
# Otherwise celery's defaults: tasks acked just before they run (acks_late off), a prefetch
# multiplier of 4, kombu's Redis transport with its default visibility timeout (1 hour).


def _record_lateness(due_ms: int) -> None:
    note_lateness(due_ms)


# Registered by call, not with @app.task: celery has no type hints, and the decorator would
# make the function untyped for mypy.
record_lateness: Any = app.task(name="benchmarks.peer_celery.record_lateness")(_record_lateness)
