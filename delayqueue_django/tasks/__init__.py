"""A Django Tasks backend on delayqueue_django queues.

    TASKS = {
        "default": {
            "BACKEND": "delayqueue_django.tasks.DelayQueueBackend",
            "QUEUES": ["default"],  # DELAYQUEUES aliases
            "OPTIONS": {"RESULT_TTL": timedelta(days=7)},
        }
    }

Needs Django 6.0+ (``django.tasks``) or, on Django 5.2, the ``django-tasks`` backport. The
backend is loaded lazily so that this package can be imported without either.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delayqueue_django.tasks.backend import DelayQueueBackend

__all__ = ["DelayQueueBackend"]


def __getattr__(name: str) -> Any:
    if name == "DelayQueueBackend":
        from delayqueue_django.tasks.backend import DelayQueueBackend

        return DelayQueueBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
