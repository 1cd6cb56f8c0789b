"""The message whose handler is running, for code the handler calls
(``delayqueue_django.current_message()``): a context variable, so it is right in a handler
thread and in each coroutine on the worker's event loop alike (a thread-local would be
shared by every coroutine of the loop)."""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from delayqueue_django.core.message import Message

_current: ContextVar[Message | None] = ContextVar("delayqueue_current_message", default=None)


def current_message() -> Message | None:
    """The message being handled in this thread or task, or None outside a handler."""
    return _current.get()


@contextmanager
def handling(message: Message) -> Iterator[None]:
    """``message`` is the current message inside the block."""
    token = _current.set(message)
    try:
        yield
    finally:
        _current.reset(token)
