"""Running one ``async def`` handler on the worker's event loop, and turning its result into
a verdict by the same rules as a sync handler's (handling.judge_result, judge_error).

Two things differ from a handler thread:

- TIME_LIMIT is a real stop: the coroutine is cancelled at the limit (``asyncio.timeout``)
  and the attempt fails with ``TimeLimitExceeded``, while the loop goes on serving the
  others. (A handler that catches the cancellation and carries on cannot be stopped.)
- Database connections: the async ORM runs every query through
  ``sync_to_async(thread_sensitive=True)``, in one shared thread, whose connections are the
  ones to close when broken or past CONN_MAX_AGE, around each handler as around sync ones.
  That costs a hop to that thread each time, so it is paid only once a connection was
  opened in that thread: handlers that never use the async ORM pay nothing for it.
"""

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.db.backends.signals import connection_created

from delayqueue_django.core import current, time_limits, tracing
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.worker.handling import Outcome, judge_error, judge_result, not_awaitable

# The threads (by ident) where this process opened a database connection, and the thread
# where the async ORM runs its queries (asgiref's thread for thread-sensitive calls, learnt
# once it matters): until a connection was opened there, there is nothing to refresh.
_connections_opened_in: set[int] = set()
_orm_thread: int | None = None


def _note_connection_opened(**kwargs: Any) -> None:
    _connections_opened_in.add(threading.get_ident())


connection_created.connect(_note_connection_opened, dispatch_uid="delayqueue-connection-opened")

_close_old_connections = sync_to_async(close_old_connections, thread_sensitive=True)


async def _refresh_connections() -> None:
    """close_old_connections() where the async ORM's connections are, if it has any."""
    global _orm_thread
    if not _connections_opened_in:
        return
    if _orm_thread is None:
        _orm_thread = await sync_to_async(threading.get_ident, thread_sensitive=True)()
    if _orm_thread in _connections_opened_in:
        await _close_old_connections()


async def acall_handler(
    handler: Handler,
    message: Message,
    *,
    manage_connections: bool = True,
    time_limit: float | None = None,
) -> Outcome:
    """Await the async handler as call_handler calls a sync one (see there); with
    ``time_limit``, cancel it at the limit: a failed attempt, ``TimeLimitExceeded``."""
    if time_limit is None:
        return await _traced_call(handler, message, manage_connections, None)
    with time_limits.running(message, time_limit):
        return await _traced_call(handler, message, manage_connections, time_limit)


async def _traced_call(
    handler: Handler, message: Message, manage_connections: bool, time_limit: float | None
) -> Outcome:
    if not tracing.active():
        return await _call(handler, message, manage_connections, time_limit)
    with tracing.consumer_span(message) as span:
        outcome = await _call(handler, message, manage_connections, time_limit)
        tracing.record_outcome(span, outcome.verdict.value, outcome.error)
    return outcome


async def _call(
    handler: Handler, message: Message, manage_connections: bool, time_limit: float | None
) -> Outcome:
    if manage_connections:
        await _refresh_connections()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with current.handling(message):
            if time_limit is None:
                result = await handler(message)
            else:
                result = await _within(handler, message, time_limit)
            result = not_awaitable(handler, result, from_async=True)
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this task is being cancelled from outside: not the handler's verdict
        outcome = judge_error(message, error, loop.time() - started)
    except BaseException as error:  # a handler must never take the loop down
        outcome = judge_error(message, error, loop.time() - started)
    else:
        outcome = judge_result(message, result, loop.time() - started)
    finally:
        if manage_connections:
            await _refresh_connections()
    return outcome


async def _within(handler: Handler, message: Message, limit: float) -> Any:
    try:
        async with asyncio.timeout(limit) as scope:
            return await handler(message)
    except TimeoutError as error:
        if not scope.expired():
            raise  # the handler's own time-out, not the limit's
        raise time_limits.cancelled_at(limit) from error
