"""``get_queue``: the Queue objects built from settings, one per name, until settings change."""

import threading

from django.apps import apps

from delayqueue_django.core import conf, connections
from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import QueueConfigurationError, UnknownQueue

_queues: dict[str, Queue] = {}
_lock = threading.Lock()


def get_queue(name: str = "default") -> Queue:
    """The queue configured as ``DELAYQUEUES[name]``."""
    queue = _queues.get(name)
    if queue is not None:
        return queue
    _require_installed()
    configs = conf.queue_configs()
    if name not in configs:
        configured = ", ".join(map(repr, configs)) or "none (DELAYQUEUES is empty)"
        raise UnknownQueue(f"no queue named {name!r} in DELAYQUEUES; configured: {configured}")
    with _lock:
        if name not in _queues:
            _queues[name] = Queue(configs[name])
        return _queues[name]


def _require_installed() -> None:
    """Refuse to build queues for a project that forgot the app: its messages would be sent,
    with no worker command to run them, no system checks and no settings changes followed.
    Asked when a queue is built, never on the send path. Code running before the app
    registry is ready (a module-level get_queue) cannot be told yet, and passes."""
    if apps.apps_ready and not apps.is_installed("delayqueue_django"):
        raise QueueConfigurationError(
            'delayqueue_django is not in INSTALLED_APPS: add "delayqueue_django" to '
            "INSTALLED_APPS in your settings (the worker command run_delayqueue, the system "
            "checks and the admin pages come with it)."
        )


def queue_names() -> list[str]:
    return list(conf.queue_configs())


def reset() -> None:
    """Forget queues, parsed settings and URL clients, so the next use reads settings anew."""
    with _lock:
        _queues.clear()
    conf.reset()
    connections.reset()
