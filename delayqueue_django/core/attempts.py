"""What a refused delivery's attempt record says, made in the worker before the verdict is
sent: the verdict its error names, the error's class, text and traceback (cleaned by the
queue's HISTORY_REDACT first, then cut to their bounds), this worker and how long ago the
handler started. The script that writes the verdict writes the record (see "Attempt
records" in _prelude.lua)."""

import logging
import os
import socket
import traceback
from collections.abc import Callable
from functools import cache
from typing import Any

from django.utils.module_loading import import_string

from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.engine.history import (
    ERROR_BYTES,
    TRACEBACK_BYTES,
    AttemptNote,
    cut_head,
    cut_tail,
)
from delayqueue_django.engine.records import (
    ERROR,
    NACK,
    POSTPONE,
    REJECT,
    RETRY,
    TIME_LIMIT,
)
from delayqueue_django.exceptions import Postpone, Reject, Retry, TimeLimitExceeded

logger = logging.getLogger("delayqueue_django.worker")

Redact = Callable[[Message, BaseException], Any]


def worker_name() -> str:
    """This process as attempt records name it, as the Tasks runner names its workers:
    "host:pid" (the pid read each time: a forked worker is a process of its own)."""
    return f"{socket.gethostname()}:{os.getpid()}"[-64:]


def verdict_of(error: BaseException | None, default: str = NACK) -> str:
    """The verdict a handler's error stands for; ``default`` when it raised nothing."""
    if error is None:
        return default
    if isinstance(error, Postpone):
        return POSTPONE
    if isinstance(error, Retry):
        return RETRY
    if isinstance(error, Reject):
        return REJECT
    if isinstance(error, TimeLimitExceeded):
        return TIME_LIMIT
    return ERROR


def note_for(
    config: QueueConfig,
    message: Message,
    error: BaseException | None,
    *,
    verdict: str | None = None,
    ran_seconds: float | None = None,
) -> AttemptNote:
    """The record of a refused attempt: ``error`` (None for a handler that returned False)
    as HISTORY_REDACT leaves it, ``verdict`` (by default the one the error names) and
    ``ran_seconds``, how long the handler ran (the record's start is the verdict's time
    less that; None: not known)."""
    verdict = verdict or verdict_of(error)
    ago = None if ran_seconds is None else round(ran_seconds * 1000)
    if error is None:
        return AttemptNote(verdict, worker=worker_name(), started_ago_ms=ago)
    stored, failure = _redacted(config, message, error)
    if stored is None:
        return AttemptNote(
            verdict,
            _class_path(error),
            f"(redaction failed: {failure})",
            worker=worker_name(),
            started_ago_ms=ago,
        )
    text, text_cut = cut_head(_text_of(stored), ERROR_BYTES)
    tail, tail_cut = cut_tail(_traceback_of(stored), TRACEBACK_BYTES)
    return AttemptNote(
        verdict,
        _class_path(stored),
        text,
        tail,
        worker_name(),
        ago,
        text_cut,
        tail_cut,
    )


def _redacted(
    config: QueueConfig, message: Message, error: BaseException
) -> tuple[BaseException | None, str]:
    """The exception to store: ``error`` itself without HISTORY_REDACT, else what it
    returns. When it raises or returns no exception: None, and the class of what went
    wrong (logged, never the error's text)."""
    if config.history_redact is None:
        return error, ""
    try:
        stored = _redact_function(config.history_redact)(message, error)
    except Exception as failure:
        failed = _class_path(failure)
    else:
        if isinstance(stored, BaseException):
            return stored, ""
        failed = f"returned {type(stored).__name__}, not an exception"
    logger.error(
        "HISTORY_REDACT %s failed for message id=%s queue=%s: %s; the attempt record keeps "
        "only the error's class",
        config.history_redact,
        loggable(message.id),
        message.queue,
        failed,
    )
    return None, failed


@cache
def _redact_function(path: str) -> Redact:
    redact: Redact = import_string(path)
    return redact


def _class_path(error: BaseException) -> str:
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"


def _text_of(error: BaseException) -> str:
    try:
        return str(error)
    except Exception as failure:  # a __str__ that raises: say so, never fail the verdict
        return f"(str() of the error raised {_class_path(failure)})"


def _traceback_of(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(error))
    except Exception as failure:
        return f"(formatting the traceback raised {_class_path(failure)})"
