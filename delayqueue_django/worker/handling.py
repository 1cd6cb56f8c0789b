"""Running one handler call and turning its result into a verdict."""

import logging
import time
from dataclasses import dataclass
from enum import Enum

from django.db import close_old_connections

from delayqueue_django.exceptions import Reject
from delayqueue_django.handlers import Handler
from delayqueue_django.message import Message

logger = logging.getLogger("delayqueue_django.worker")


class Verdict(Enum):
    ACK = "ack"
    NACK = "nack"
    BURY = "bury"
    # Fetched but never started: hand it back without using a retry.
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class Outcome:
    message: Message
    verdict: Verdict
    error: BaseException | None = None
    seconds: float = 0.0


def call_handler(
    handler: Handler,
    message: Message,
    *,
    manage_connections: bool = True,
    connections_checked: bool = False,
) -> Outcome:
    """Call the handler as a request would be served: stale DB connections closed around it.

    ``connections_checked`` skips the check before the call when this thread has just done it,
    after the message it handled before (back to back, with no wait in between).

    Returns None/True: ack. False: nack. Raises Reject: bury now. Raises anything else: nack,
    with the traceback logged. Nothing a handler does escapes to the worker.

    ``manage_connections=False`` leaves the connections alone, as Django's test client does
    for requests: inside a test's transaction, closing them would break the test.
    """
    if manage_connections and not connections_checked:
        close_old_connections()
    started = time.perf_counter()
    try:
        result = handler(message)
    except Reject as error:
        outcome = Outcome(message, Verdict.BURY, error, time.perf_counter() - started)
        logger.warning(
            "handler rejected message id=%s queue=%s attempt=%s: %s",
            message.id,
            message.queue,
            message.attempt,
            error,
        )
    except BaseException as error:  # a handler must never take its thread down
        outcome = Outcome(message, Verdict.NACK, error, time.perf_counter() - started)
        logger.exception(
            "handler failed message id=%s queue=%s attempt=%s",
            message.id,
            message.queue,
            message.attempt,
        )
    else:
        verdict = Verdict.NACK if result is False else Verdict.ACK
        outcome = Outcome(message, verdict, None, time.perf_counter() - started)
        logger.debug(
            "handled message id=%s queue=%s attempt=%s verdict=%s in %.1f ms",
            message.id,
            message.queue,
            message.attempt,
            verdict.value,
            outcome.seconds * 1000,
        )
    finally:
        if manage_connections:
            close_old_connections()
    return outcome
