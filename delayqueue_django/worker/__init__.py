"""The consumer side: ``Worker`` runs handlers for queues; ``run_delayqueue`` wraps it."""

from delayqueue_django.worker.in_process import WorkerThread, start_worker_thread
from delayqueue_django.worker.worker import Worker

__all__ = ["Worker", "WorkerThread", "start_worker_thread"]
