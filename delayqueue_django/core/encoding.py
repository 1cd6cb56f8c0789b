"""Turning what ``send`` is given into what the store keeps: JSON text, due times, ids."""

import json
import math
import os
import re
from base64 import urlsafe_b64encode
from datetime import UTC, datetime, timedelta
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


# An id is 14 URL-safe base64 characters: 84 random bits, cut from the 16 characters of 12
# random bytes (base64 of 12 bytes has no padding to strip). Not 16: Redis keeps each id
# twice per pending message (its pending entry, its payload field), in an allocation of its
# length plus 2 bytes, and jemalloc's size classes put 14 characters in 16 bytes and 16
# characters in 24 or 32: 16 characters cost about 30 bytes more per message.
ID_BYTES = 12
ID_CHARS = 14

# One encoder for every payload: json.dumps(cls=...) would build a new one per call, which
# costs more than encoding a small payload. Encoding keeps no state between calls.
_ENCODER = DjangoJSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def new_message_ids(count: int) -> list[str]:
    """``count`` new ids, each 14 URL-safe characters (84 random bits: short in Redis,
    unique in practice), from one read of the system's random source (as secrets does)."""
    text = urlsafe_b64encode(os.urandom(ID_BYTES * count)).decode("ascii")
    step = ID_BYTES * 4 // 3  # the characters of one id's bytes
    return [text[start : start + ID_CHARS] for start in range(0, len(text), step)]


def new_message_id() -> str:
    """One new id, as new_message_ids makes them (a send per message: no list to cut)."""
    return urlsafe_b64encode(os.urandom(ID_BYTES)).decode("ascii")[:ID_CHARS]


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
    if _MAYBE_NON_STR_KEY.search(text):
        _refuse_colliding_keys(payload, queue)
    return text


# JSON keys are strings: the encoder writes a key that is not one as text (1 as "1", 1.5 as
# "1.5", True as "true", None as "null"), so {1: "a", "1": "b"} becomes {"1":"a","1":"b"},
# which decodes as {"1": "b"}. Only an object with such a key can lose one, and every such
# key is written as this pattern matches (a number, true, false or null, then ":"), so a
# payload whose text has no match needs no further look: most never pay for the walk below.
_MAYBE_NON_STR_KEY = re.compile(r'"[-0-9tfn][-+.0-9aeulrs]*":')
_CONTAINERS = (dict, list, tuple)


def _refuse_colliding_keys(payload: Any, queue: str) -> None:
    """PayloadEncodingError if two keys of one object, at any depth, are written as the same
    JSON text. Walks what the encoder walked (it succeeded: no cycles), without recursion."""
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            # Keys that are all str cannot collide (they are distinct strings already).
            if any(not isinstance(key, str) for key in value):
                _check_keys(value, queue)
            children = value.values()
        else:
            children = value
        stack.extend(child for child in children if isinstance(child, _CONTAINERS))


def _check_keys(mapping: dict[Any, Any], queue: str) -> None:
    written: dict[str, Any] = {}
    for key in mapping:
        text = _key_text(key)
        if text in written:
            raise PayloadEncodingError(
                f"payload for queue {queue!r} has keys {written[text]!r} and {key!r} in one "
                f"object; JSON writes both as {text!r} and would keep only one of them"
            )
        written[text] = key


def _key_text(key: Any) -> str:
    """A dict key as the JSON encoder writes it (the same tests, in the same order)."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    return int.__repr__(key)


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
    """``(at_ms, delay_us)`` for the store: an absolute time, or a delay from Redis's clock.

    A delay is counted from the Redis server's clock when it runs the send, never this
    machine's, so producers with skewed clocks still deliver on time; it is kept to the
    microsecond, and the store rounds the due time up to the millisecond. An ``at`` is
    rounded up to the millisecond here; one in the past means "due now" (the store makes it
    its own now). Rounding up keeps every message from being handed out before its time.
    """
    if delay is not None and at is not None:
        raise InvalidDelay("give either delay or at, not both")
    if at is not None:
        return _at_ms(at), 0
    if delay is None:
        return None, 0
    return None, delay_in_us(delay)


def delay_in_us(delay: Any) -> int:
    """A delay (seconds, or a timedelta) in whole microseconds."""
    if isinstance(delay, timedelta):
        seconds: int | float = delay.total_seconds()
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
    # Compared before converting, which could overflow a float; and the value is not
    # quoted, as an int with thousands of digits cannot even be printed.
    if seconds > LATEST_DELAY_SECONDS:
        raise InvalidDelay(f"delay is too far in the future (at most {LATEST_DELAY_SECONDS:g} s)")
    if isinstance(delay, timedelta):
        micros: int = delay // _MICROSECOND  # exact: a timedelta is a whole number of µs
        return micros
    if isinstance(seconds, int):
        return seconds * 1_000_000
    # To the nearest µs: a float's own error is far smaller, and rounding it up would turn
    # 2.007 s (2.00699999... as a float) into 2,007,001 µs, a whole ms more once rounded up.
    return round(seconds * 1_000_000)


def delay_in_ms(delay: Any) -> int:
    """A delay (seconds, or a timedelta) in whole milliseconds, rounded up."""
    return -(-delay_in_us(delay) // 1000)


_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    # In whole µs from the epoch, exactly (a float timestamp would round them), then up to
    # the millisecond. A time before 1970 is long past: due now all the same.
    micros: int = (at - _EPOCH) // _MICROSECOND
    return max(-(-micros // 1000), 0)


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
