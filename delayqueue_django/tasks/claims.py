"""Which DELAYQUEUES queues carry Django tasks: those a TASKS backend of ours lists.

Read from settings alone, so that finding a queue's handler never needs the task framework
unless a task backend is configured.
"""

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

DEFAULT_TASK_QUEUES = ("default",)

# The class attribute that tells DelayQueueBackend and its subclasses from other backends,
# without importing the backend here (it imports this module, and needs the framework).
CARRIES_DELAYQUEUES = "carries_delayqueues"


def delayqueue_backends() -> dict[str, dict[str, Any]]:
    """The TASKS entries whose BACKEND is DelayQueueBackend or a subclass, by alias."""
    found = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend_class = import_string(path)
        except ImportError:
            continue  # the framework reports unknown backends itself
        if getattr(backend_class, CARRIES_DELAYQUEUES, False) is True:
            found[alias] = params
    return found


def task_queue_names() -> set[str]:
    """Queues that some DelayQueueBackend sends tasks to."""
    names: set[str] = set()
    for params in delayqueue_backends().values():
        names.update(params.get("QUEUES", DEFAULT_TASK_QUEUES))
    return names
