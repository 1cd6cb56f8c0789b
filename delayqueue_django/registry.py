"""``get_queue``: the Queue objects built from settings, one per name, until settings change."""

import threading

from delayqueue_django import conf, connections, stores
from delayqueue_django.exceptions import UnknownQueue
from delayqueue_django.queue import Queue

_queues: dict[str, Queue] = {}
_lock = threading.Lock()


def get_queue(name: str = "default") -> Queue:
    """The queue configured as ``DELAYQUEUES[name]``."""
    queue = _queues.get(name)
    if queue is not None:
        return queue
    configs = conf.queue_configs()
    if name not in configs:
        configured = ", ".join(map(repr, configs)) or "none (DELAYQUEUES is empty)"
        raise UnknownQueue(f"no queue named {name!r} in DELAYQUEUES; configured: {configured}")
    with _lock:
        if name not in _queues:
            _queues[name] = Queue(configs[name], stores.store_for(configs[name]))
        return _queues[name]


def queue_names() -> list[str]:
    return list(conf.queue_configs())


def reset() -> None:
    """Forget queues, parsed settings and URL clients, so the next use reads settings anew."""
    with _lock:
        _queues.clear()
    conf.reset()
    connections.reset()
