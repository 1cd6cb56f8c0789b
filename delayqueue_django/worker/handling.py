"""Running one handler call and turning its result into a verdict."""

import functools
import inspect
import logging
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from django.db import close_old_connections as close_stale_connections
from django.db import connections

from delayqueue_django.core import current, features, time_limits, tracing
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.engine.quick_records import quick
from delayqueue_django.exceptions import (
    HandlerReturnedAwaitable,
    Postpone,
    Reject,
    Retry,
    TimeLimitExceeded,
)
from delayqueue_django.outbox import exactly_once

logger = logging.getLogger("delayqueue_django.worker")


class Verdict(Enum):
    """What becomes of a delivery once its handler returned."""

    ACK = "ack"
    """Handled: the message is deleted."""
    NACK = "nack"
    """Refused (the handler raised or returned False): retried while retries are left."""
    BURY = "bury"
    """Rejected (the handler raised ``Reject``): a dead letter at once."""
    RELEASE = "release"
    """Fetched but never started: handed back without using a retry."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One handler call: the message, its verdict, and the handler's exception if any."""

    message: Message
    verdict: Verdict
    error: BaseException | None = None
    seconds: float = 0.0
    """How long the handler ran."""
    delay_ms: int | None = None
    """A NACK's own delay before the retry (the handler raised Retry or Postpone), instead
    of the queue's NACK_REDELIVERY_DELAY."""
    postponed: bool = False
    """A NACK that is a postpone (the handler raised Postpone): no attempt is used."""


def _thread_connections() -> Any:
    """Where Django keeps each thread's database connections, when that is a
    ``threading.local`` (asgiref's thread-critical Local keeps a sync thread's there, and
    an async context's under it, in its ``cvar``); None if this asgiref keeps them otherwise."""
    local = vars(connections).get("_connections")
    storage = None if local is None else vars(local).get("_storage")
    return storage if type(storage) is threading.local else None


_THREAD_CONNECTIONS = _thread_connections()


def close_old_connections() -> None:
    """Django's close_old_connections(), unless this thread has provably no connection to
    look at: it looks only at the connections this thread initialized (``connections.all(
    initialized_only=True)``), and a thread that has none has nothing in its storage. The
    look itself costs a failed attribute lookup through asgiref per database alias, every
    message; a handler that touched the database leaves its connection there, and is
    checked (CONN_MAX_AGE, broken connections) as before."""
    if _THREAD_CONNECTIONS is not None and not vars(_THREAD_CONNECTIONS):
        return
    close_stale_connections()


# Outcomes, built without Outcome's frozen __init__ (see engine.quick_records).
_outcome = quick(Outcome)


def call_handler(
    handler: Handler,
    message: Message,
    *,
    manage_connections: bool = True,
    connections_checked: bool = False,
    time_limit: float | None = None,
) -> Outcome:
    """Call the handler as a request would be served: stale DB connections closed around it.

    ``connections_checked`` skips the check before the call when this thread has just done it,
    after the message it handled before (back to back, with no wait in between).

    Returns None/True: ack. False: nack. Raises Reject: bury now. Raises Postpone: back
    after its delay, no attempt used. Raises Retry: nack after its delay instead of the
    queue's. Raises anything else: nack, with the traceback logged. Nothing a handler does
    escapes to the worker. On an EXACTLY_ONCE queue the handler runs in a transaction that
    records the message as processed; a message processed before is acked without running
    it (see exactly_once).

    ``manage_connections=False`` leaves the connections alone, as Django's test client does
    for requests: inside a test's transaction, closing them would break the test.

    With OpenTelemetry installed and a tracer provider set, the call runs in a consumer
    span (see tracing.py).

    ``time_limit`` (the queue's TIME_LIMIT): what ``message.time_left()`` counts down from.
    """
    if time_limit is None:  # (the usual case: no context to enter per message)
        return _traced_call(handler, message, manage_connections, connections_checked)
    with time_limits.running(message, time_limit):
        return _traced_call(handler, message, manage_connections, connections_checked)


def _traced_call(
    handler: Handler, message: Message, manage_connections: bool, connections_checked: bool
) -> Outcome:
    if not tracing.active():
        return _call_handler(
            handler,
            message,
            manage_connections=manage_connections,
            connections_checked=connections_checked,
        )
    with tracing.consumer_span(message) as span:
        outcome = _call_handler(
            handler,
            message,
            manage_connections=manage_connections,
            connections_checked=connections_checked,
        )
        tracing.record_outcome(span, outcome.verdict.value, outcome.error)
    return outcome


def _processed_before(message: Message) -> None:
    """Tell the Tasks wing of a message acked as processed before: a task's result follows
    its committed transaction. Its failure is logged; the ack goes on."""
    tasks = features.tasks()
    if tasks is None:
        return
    try:
        tasks.processed_before(message)
    except Exception:
        logger.exception(
            "recording the result of message id=%s queue=%s, processed before, failed",
            loggable(message.id),
            message.queue,
        )


def _call_handler(
    handler: Handler,
    message: Message,
    *,
    manage_connections: bool = True,
    connections_checked: bool = False,
) -> Outcome:
    if manage_connections and not connections_checked:
        close_old_connections()
    started = time.perf_counter()
    # The current message, set and reset by hand rather than with current.handling(): this
    # runs for every message, and a context manager's calls cost as much again.
    token = current.CURRENT.set(message)
    try:
        database = exactly_once.database_for(message.queue)
        if database is None:
            result = handler(message)
            if result is not None and result is not True and result is not False:
                result = not_awaitable(handler, result)
        else:
            result = exactly_once.call_once(refusing_awaitables(handler), message, database)
    except BaseException as error:  # a handler must never take its thread down
        outcome = judge_error(message, error, time.perf_counter() - started)
    else:
        outcome = judge_result(message, result, time.perf_counter() - started)
    finally:
        current.CURRENT.reset(token)
        if manage_connections:
            close_old_connections()
    return outcome


def not_awaitable(handler: Handler, result: Any, *, from_async: bool = False) -> Any:
    """``result``, unless it is an awaitable a handler returned (``from_async``: what an
    async handler's coroutine returned, the forgotten ``return await``) or a generator (a
    handler with a ``yield``): then refused with HandlerReturnedAwaitable. Nothing awaited
    or iterated it, so whatever it was to do never ran; an ack would lose the message
    without a trace."""
    if result is None or result is True or result is False:
        return result  # the verdicts handlers return: no more to look at, on every message
    name = f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"
    if inspect.isasyncgen(result) or inspect.isgenerator(result):
        # A ``yield`` in the handler: calling it ran none of its body.
        raise HandlerReturnedAwaitable(
            f"handler {name} returned {type(result).__name__} {result!r}: it is a generator "
            "function (a yield in its body), so calling it ran none of it. A handler returns "
            "its verdict: remove the yield (and declare it `async def` to await in it)"
        )
    if not inspect.isawaitable(result):
        return result
    if inspect.iscoroutine(result):
        result.close()  # never to run: closed, so Python does not warn of it as well
    advice = (
        "Await it in the handler (`return await ...`, or `await ...` then return)"
        if from_async
        else "Declare the handler `async def`: the worker awaits async handlers on its event loop"
    )
    raise HandlerReturnedAwaitable(
        f"handler {name} returned {type(result).__name__} {result!r} without awaiting it; "
        f"nothing of it ran. {advice}"
    )


def refusing_awaitables(handler: Handler) -> Handler:
    """The handler, raising HandlerReturnedAwaitable where it returns an awaitable (inside
    an EXACTLY_ONCE transaction: which then rolls back, the message not recorded as
    processed)."""

    @functools.wraps(handler)
    def checked(message: Message) -> Any:
        return not_awaitable(handler, handler(message))

    return checked


def judge_result(message: Message, result: Any, seconds: float) -> Outcome:
    """The outcome of a handler that returned ``result``: False is a nack, anything else an
    ack."""
    verdict = Verdict.NACK if result is False else Verdict.ACK
    if logger.isEnabledFor(logging.DEBUG):  # (its arguments cost every message otherwise)
        logger.debug(
            "handled message id=%s queue=%s attempt=%s verdict=%s in %.1f ms",
            loggable(message.id),
            message.queue,
            message.attempt,
            verdict.value,
            seconds * 1000,
        )
    return _outcome(message, verdict, None, seconds)


def judge_error(message: Message, error: BaseException, seconds: float) -> Outcome:
    """The outcome of a handler call that raised ``error``, logged as its kind asks."""
    if isinstance(error, exactly_once.WriteLockBusy):
        logger.warning(
            "message id=%s queue=%s attempt=%s handed back: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error,
        )
        return Outcome(message, Verdict.RELEASE, error, seconds)
    if isinstance(error, exactly_once.AlreadyProcessed):
        logger.info(
            "message id=%s queue=%s attempt=%s was processed before (its transaction "
            "committed): acked without running the handler again",
            loggable(message.id),
            message.queue,
            message.attempt,
        )
        _processed_before(message)
        return Outcome(message, Verdict.ACK, None, seconds)
    if isinstance(error, Postpone):
        logger.info(
            "handler postponed message id=%s queue=%s attempt=%s by %d ms%s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error.delay_ms,
            _said(error.reason),
        )
        return Outcome(
            message, Verdict.NACK, error, seconds, delay_ms=error.delay_ms, postponed=True
        )
    if isinstance(error, Retry):
        # A failure the handler expected: one line, no traceback.
        logger.warning(
            "handler asked to retry message id=%s queue=%s attempt=%s%s%s",
            loggable(message.id),
            message.queue,
            message.attempt,
            "" if error.delay_ms is None else f" in {error.delay_ms} ms",
            _said(error.reason),
        )
        return Outcome(message, Verdict.NACK, error, seconds, delay_ms=error.delay_ms)
    if isinstance(error, Reject):
        logger.warning(
            "handler rejected message id=%s queue=%s attempt=%s%s",
            loggable(message.id),
            message.queue,
            message.attempt,
            _said(str(error)),
        )
        return Outcome(message, Verdict.BURY, error, seconds)
    if isinstance(error, HandlerReturnedAwaitable | TimeLimitExceeded):
        # Their text says all there is: the traceback would show only the worker's frames.
        logger.error(
            "handler failed message id=%s queue=%s attempt=%s: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error,
        )
        return Outcome(message, Verdict.NACK, error, seconds)
    logger.error(
        "handler failed message id=%s queue=%s attempt=%s",
        loggable(message.id),
        message.queue,
        message.attempt,
        exc_info=(type(error), error, error.__traceback__),
    )
    return Outcome(message, Verdict.NACK, error, seconds)


def _said(reason: str) -> str:
    """A verdict's reason for its log line, after a colon; nothing when the handler gave
    none (the exception's own default text would repeat what the line says)."""
    return f": {reason}" if reason else ""
