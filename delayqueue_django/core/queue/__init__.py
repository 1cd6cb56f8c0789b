"""``Queue``: one configured queue, as producers, workers and the admin use it.

It validates and encodes what it is given, then leaves every change of state to the store's
Lua scripts. Bad input raises before anything is written.

Its API comes in parts, one module each: producing (send, send_many, cancel), consuming
(fetch and the verdicts, for hand-written consumers), operating (stats, listing, peeking,
requeue, purge, delete, deliver now), flow (pause, resume, the run-time rate limit), metrics
(the metrics history and the throughput read from it) and
their async twins, all over base (the settings and
the store).
"""

from delayqueue_django.core.queue.async_twins import QueueAsync
from delayqueue_django.core.queue.consuming import Exhausted, Fetched, QueueConsuming
from delayqueue_django.core.queue.flow import Flow, QueueFlow
from delayqueue_django.core.queue.metrics import Metrics, QueueMetrics
from delayqueue_django.core.queue.operating import QueueOperating
from delayqueue_django.core.queue.producing import QueueProducing


class Queue(QueueAsync, QueueProducing, QueueConsuming, QueueOperating, QueueFlow, QueueMetrics):
    """One queue of ``DELAYQUEUES``; get it with ``delayqueue_django.get_queue(name)``."""


__all__ = ["Exhausted", "Fetched", "Flow", "Metrics", "Queue"]
