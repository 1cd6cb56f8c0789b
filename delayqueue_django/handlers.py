"""Finding a queue's handler: the HANDLER setting, or a function registered with @handler."""

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from delayqueue_django.conf import QueueConfig
from delayqueue_django.message import Message

Handler = Callable[[Message], Any]

_registered: dict[str, Handler] = {}


def handler(queue: str = "default") -> Callable[[Handler], Handler]:
    """Register the decorated function as ``queue``'s handler.

    The module must be imported when Django starts (e.g. from ``AppConfig.ready``); the
    queue's HANDLER setting, when given, takes precedence.
    """

    def register(function: Handler) -> Handler:
        _registered[queue] = function
        return function

    return register


def is_registered(queue: str) -> bool:
    return queue in _registered


class HandlerNotFound(LookupError):
    """A queue has no usable handler."""


def resolve(config: QueueConfig) -> Handler:
    """HANDLER if set, else the @handler function, else the task runner on a task queue."""
    if config.handler is not None:
        try:
            found = import_string(config.handler)
        except ImportError as error:
            raise HandlerNotFound(
                f"queue {config.name!r}: HANDLER {config.handler!r} cannot be imported: {error}"
            ) from None
        if not callable(found):
            raise HandlerNotFound(
                f"queue {config.name!r}: HANDLER {config.handler!r} is not callable"
            )
        return found  # type: ignore[no-any-return]
    if config.name in _registered:
        return _registered[config.name]
    from delayqueue_django.tasks.claims import task_queue_names

    if config.name in task_queue_names():
        from delayqueue_django.tasks.runner import run_task

        return run_task
    raise HandlerNotFound(
        f"queue {config.name!r} has no handler: set DELAYQUEUES[{config.name!r}]['HANDLER'] "
        f"or decorate a function with @delayqueue_django.handler({config.name!r})"
    )
