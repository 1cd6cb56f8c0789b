"""A worker in a thread of this process: how a memory queue (``memory://``), whose messages
live in the process that sends them, gets its handlers run outside tests. For quick local
runs (``runserver`` and a worker in one process); in production, run ``run_delayqueue``."""

import threading
from types import TracebackType
from typing import Any

from delayqueue_django.core import registry
from delayqueue_django.core.handlers import resolve
from delayqueue_django.worker.worker import Worker


class WorkerThread:
    """A running ``Worker``; ``stop()`` (or leaving a ``with`` block) stops it gracefully."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, name="delayqueue-worker", daemon=True)

    def start(self) -> "WorkerThread":
        self.thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop fetching, let running handlers finish (up to the worker's grace), and wait."""
        self.worker.request_stop()
        self.thread.join(timeout)

    def __enter__(self) -> "WorkerThread":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_worker_thread(*queues: str, **options: Any) -> WorkerThread:
    """Start a worker for these queues (default: all in DELAYQUEUES) in a daemon thread.

    ``options`` are ``Worker``'s: ``concurrency``, ``batch_size``, ``burst``, ``grace``,
    ``heartbeat_interval``... Handlers are resolved as ``run_delayqueue`` resolves them, and
    its errors (unknown queue, no handler) are raised here, before anything starts.
    """
    names = list(queues) or registry.queue_names()
    chosen = [registry.get_queue(name) for name in dict.fromkeys(names)]
    worker = Worker([(queue, resolve(queue.config)) for queue in chosen], **options)
    return WorkerThread(worker).start()
