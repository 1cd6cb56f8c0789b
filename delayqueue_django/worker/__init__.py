"""The consumer side: ``Worker`` runs handlers for queues; ``run_delayqueue`` wraps it."""

from delayqueue_django.worker.worker import Worker

__all__ = ["Worker"]
