"""How a queue stands, for the overview's row and the top of its page: paused or flowing, a
rate limit set at run time (which overrides the RATE_LIMIT setting, so that the settings
alone no longer say what is in force), and how many worker processes serve it. Each is
a reason a queue's messages may wait that its counts do not show."""

from dataclasses import dataclass
from typing import Any

from delayqueue_django.core.conf.flow import shown_rate
from delayqueue_django.core.queue import Flow, Queue
from delayqueue_django.monitoring.reports import worker_processes


@dataclass(frozen=True)
class QueueStatus:
    paused: bool
    # The rate limit set at run time ("3/m"), "" while the setting's is in force.
    runtime_rate: str
    # The RATE_LIMIT setting ("2/s"), "" for none.
    setting_rate: str
    # Live worker processes whose heartbeat lists the queue: a supervisor (run_delayqueue
    # --processes) handles nothing itself, so one alone counts as none, as in
    # ``delayqueue_stats --require-workers``.
    workers: int

    @property
    def no_worker(self) -> bool:
        return self.workers == 0


def queue_status(queue: Queue, flow: Flow, workers: list[dict[str, Any]]) -> QueueStatus:
    """The queue's status from its flow gates (``queue.flow()``) and its live workers'
    heartbeats (``heartbeat.live_workers``), which the caller reads: both on shard 0 of a
    sharded queue."""
    return QueueStatus(
        paused=flow.paused,
        runtime_rate=flow.rate_limit if flow.rate_limit_overridden else "",
        setting_rate=shown_rate(queue.config.rate_limit),
        workers=len(worker_processes(workers)),
    )
