"""Running one handler call and turning its result into a verdict."""

import logging
import time
from dataclasses import dataclass
from enum import Enum

from django.db import close_old_connections

from delayqueue_django.core import features, time_limits, tracing
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.exceptions import Postpone, Reject, Retry
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
    try:
        database = exactly_once.database_for(message.queue)
        if database is None:
            result = handler(message)
        else:
            result = exactly_once.call_once(handler, message, database)
    except exactly_once.WriteLockBusy as error:
        outcome = Outcome(message, Verdict.RELEASE, error, time.perf_counter() - started)
        logger.warning(
            "message id=%s queue=%s attempt=%s handed back: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error,
        )
    except exactly_once.AlreadyProcessed:
        outcome = Outcome(message, Verdict.ACK, None, time.perf_counter() - started)
        logger.info(
            "message id=%s queue=%s attempt=%s was processed before (its transaction "
            "committed): acked without running the handler again",
            loggable(message.id),
            message.queue,
            message.attempt,
        )
        _processed_before(message)
    except Postpone as error:
        outcome = Outcome(
            message,
            Verdict.NACK,
            error,
            time.perf_counter() - started,
            delay_ms=error.delay_ms,
            postponed=True,
        )
        logger.info(
            "handler postponed message id=%s queue=%s attempt=%s by %d ms: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error.delay_ms,
            error,
        )
    except Retry as error:
        outcome = Outcome(
            message, Verdict.NACK, error, time.perf_counter() - started, delay_ms=error.delay_ms
        )
        logger.warning(
            "handler asked to retry message id=%s queue=%s attempt=%s in %d ms: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error.delay_ms,
            error,
        )
    except Reject as error:
        outcome = Outcome(message, Verdict.BURY, error, time.perf_counter() - started)
        logger.warning(
            "handler rejected message id=%s queue=%s attempt=%s: %s",
            loggable(message.id),
            message.queue,
            message.attempt,
            error,
        )
    except BaseException as error:  # a handler must never take its thread down
        outcome = Outcome(message, Verdict.NACK, error, time.perf_counter() - started)
        logger.exception(
            "handler failed message id=%s queue=%s attempt=%s",
            loggable(message.id),
            message.queue,
            message.attempt,
        )
    else:
        verdict = Verdict.NACK if result is False else Verdict.ACK
        outcome = Outcome(message, verdict, None, time.perf_counter() - started)
        logger.debug(
            "handled message id=%s queue=%s attempt=%s verdict=%s in %.1f ms",
            loggable(message.id),
            message.queue,
            message.attempt,
            verdict.value,
            outcome.seconds * 1000,
        )
    finally:
        if manage_connections:
            close_old_connections()
    return outcome
