"""Turning what ``send`` is given into what the store keeps: JSON text, due times, ids."""

import json
import math
import os
from base64 import urlsafe_b64encode
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from delayqueue_django.exceptions import (
    InvalidDelay,
    InvalidRetryCount,
    PayloadEncodingError,
    PayloadTooLarge,
)

# Zset scores are doubles: due times must stay exact integers of ms.
LATEST_DUE_MS = 2**53 - 1
# A delay is added to the Redis clock: half the range leaves room for any clock.
LATEST_DELAY_SECONDS = LATEST_DUE_MS // 2 / 1000


# An id is 12 random bytes: 16 URL-safe base64 characters, with no padding to strip.
ID_BYTES = 12
ID_CHARS = 16

# One encoder for every payload: json.dumps(cls=...) would build a new one per call, which
# costs more than encoding a small payload. Encoding keeps no state between calls.
_ENCODER = DjangoJSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def new_message_ids(count: int) -> list[str]:
    """``count`` new ids, each 16 URL-safe characters (96 random bits: short in Redis,
    unique in practice), from one read of the system's random source (as secrets does)."""
    text = urlsafe_b64encode(os.urandom(ID_BYTES * count)).decode("ascii")
    return [text[start : start + ID_CHARS] for start in range(0, len(text), ID_CHARS)]


def encode_payload(payload: Any, *, max_bytes: int, queue: str) -> str:
    """JSON text for the payload, or a clear error naming what is wrong with it."""
    try:
        text = _ENCODER.encode(payload)
    except TypeError as error:
        raise PayloadEncodingError(
            f"payload for queue {queue!r} is not JSON serializable: {error}"
        ) from None
    except RecursionError:
        raise PayloadEncodingError(
            f"payload for queue {queue!r} is nested too deeply to encode"
        ) from None
    except ValueError as error:  # NaN/Infinity, circular references
        raise PayloadEncodingError(
            f"payload for queue {queue!r} cannot be encoded: {error}"
        ) from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        surrogate = error.object[error.start : error.end]
        raise PayloadEncodingError(
            f"payload for queue {queue!r} holds a lone surrogate ({surrogate!r}), "
            "which UTF-8 cannot carry"
        ) from None
    if size > max_bytes:
        raise PayloadTooLarge(
            f"payload for queue {queue!r} is {size} bytes encoded; MAX_PAYLOAD_BYTES is {max_bytes}"
        )
    return text


def decode_payload(text: str) -> Any:
    """The payload's value; ValueError if the text cannot be decoded, here and now.

    Valid JSON nested too deeply for this interpreter counts as undecodable: how deep Python
    can go depends on its version and on the caller's stack, so a payload another process
    encoded may be too deep for this one, and a RecursionError escaping a fetch would take
    the messages fetched with it down too.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("payload is nested too deeply to decode") from None


def due_spec(delay: Any, at: Any) -> tuple[int | None, int]:
    """``(at_ms, delay_ms)`` for the store: an absolute time, or a delay from Redis's clock.

    A delay is counted from the Redis server's clock, never this machine's, so producers with
    skewed clocks still deliver on time. An ``at`` in the past means "due now".
    """
    if delay is not None and at is not None:
        raise InvalidDelay("give either delay or at, not both")
    if at is not None:
        return _at_ms(at), 0
    if delay is None:
        return None, 0
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidDelay(
            f"delay must be a number of seconds or a timedelta, not {type(delay).__name__}"
        )
    else:
        # Not float(delay): an int too large for a float would raise OverflowError.
        seconds = delay
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise InvalidDelay(f"delay must be a finite number of seconds, not {delay!r}")
    if seconds < 0:
        raise InvalidDelay("delay must not be negative")
    # Compared before converting to ms, which could overflow a float; and the value is not
    # quoted, as an int with thousands of digits cannot even be printed.
    if seconds > LATEST_DELAY_SECONDS:
        raise InvalidDelay(f"delay is too far in the future (at most {LATEST_DELAY_SECONDS:g} s)")
    return None, round(seconds * 1000)


def _at_ms(at: Any) -> int:
    if not isinstance(at, datetime):
        raise InvalidDelay(f"at must be a datetime, not {type(at).__name__}")
    if timezone.is_naive(at):
        if settings.USE_TZ:
            raise InvalidDelay(
                f"at={at!r} is a naive datetime while USE_TZ is True; give an aware datetime "
                "(e.g. django.utils.timezone.now() + timedelta(...))"
            )
        at = timezone.make_aware(at, timezone.get_default_timezone())
    due_ms: int = max(round(at.timestamp() * 1000), 0)
    return due_ms


def retry_budget(retry_count: Any, default: int) -> int:
    if retry_count is None:
        return default
    if (
        isinstance(retry_count, bool)
        or not isinstance(retry_count, int)
        or not 0 <= retry_count <= 1000
    ):
        raise InvalidRetryCount(f"retry_count must be an int from 0 to 1000, not {retry_count!r}")
    return retry_count
