"""Checking what a send is given about its key: the key itself, ``if_exists`` and
``unique_for``, before anything is written or deferred (see engine/keyed.py for how a key
is stored)."""

import difflib
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from delayqueue_django.core.encoding import LATEST_DELAY_SECONDS
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.keyed import KEY_MAX_BYTES
from delayqueue_django.exceptions import ConflictingOptions, InvalidKey, InvalidKeyOption

IF_EXISTS = ("keep", "replace", "error")
KEEP = "keep"
# What an unkeyed send's key fields are: (key, if_exists, unique_ms).
UNKEYED: tuple[None, str, int] = (None, KEEP, 0)


def check_key(key: Any) -> str:
    """The key, or InvalidKey saying why it cannot be one: a str of 1 to KEY_MAX_BYTES
    bytes in UTF-8 (any characters, but lone surrogates, which UTF-8 cannot carry)."""
    if not isinstance(key, str):
        raise InvalidKey(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey("key must not be empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as error:
        surrogate = error.object[error.start : error.end]
        raise InvalidKey(
            f"key holds a lone surrogate ({surrogate!r}), which UTF-8 cannot carry"
        ) from None
    if size > KEY_MAX_BYTES:
        raise InvalidKey(f"key is {size} bytes in UTF-8; a key is at most {KEY_MAX_BYTES}")
    return key


def key_fields(key: Any, if_exists: Any, unique_for: Any) -> tuple[str | None, str, int]:
    """``(key, if_exists, unique_ms)`` for a NewMessage, checked: UNKEYED when no key is
    given, ConflictingOptions when ``if_exists`` or ``unique_for`` is given without one."""
    if key is None and if_exists == KEEP and unique_for is None:
        return UNKEYED  # the common case: one comparison more than before keys
    if if_exists not in IF_EXISTS:
        raise InvalidKeyOption(if_exists_refusal(if_exists))
    if key is None:
        given = "if_exists" if unique_for is None else "unique_for"
        raise ConflictingOptions(
            f"{given} applies to a message's key, and no key was given: pass key=..."
        )
    return check_key(key), if_exists, 0 if unique_for is None else unique_ms(unique_for)


def if_exists_refusal(if_exists: Any) -> str:
    """Why ``if_exists`` is refused, with the value it was likely meant to be."""
    allowed = f"{IF_EXISTS[0]!r}, {IF_EXISTS[1]!r} or {IF_EXISTS[2]!r}"
    refusal = f"if_exists must be {allowed}, not {if_exists!r}"
    if isinstance(if_exists, str):
        guesses = difflib.get_close_matches(if_exists.lower(), IF_EXISTS, n=1)
        if guesses:
            return f"{refusal}: did you mean {guesses[0]!r}?"
    return refusal


def unique_ms(unique_for: Any) -> int:
    """How long a key stays held after the send that creates its message: seconds (an int
    or float, finite, more than 0) or a timedelta, in whole ms rounded up; InvalidKeyOption
    if it is neither."""
    if isinstance(unique_for, timedelta):
        seconds: int | float = unique_for.total_seconds()
    elif isinstance(unique_for, bool) or not isinstance(unique_for, int | float):
        raise InvalidKeyOption(
            "unique_for must be a number of seconds or a timedelta, "
            f"not {type(unique_for).__name__}"
        )
    else:
        seconds = unique_for
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise InvalidKeyOption(f"unique_for must be a finite number of seconds, not {unique_for!r}")
    if seconds <= 0:
        raise InvalidKeyOption("unique_for must be more than 0 seconds")
    # Compared before converting (a huge int would overflow a float), as send's delay is.
    if seconds > LATEST_DELAY_SECONDS:
        raise InvalidKeyOption(f"unique_for is too long (at most {LATEST_DELAY_SECONDS:g} s)")
    if isinstance(unique_for, timedelta):
        return -(-unique_for // timedelta(milliseconds=1))
    if isinstance(seconds, int):
        return seconds * 1000
    # To the nearest µs first (a float's own error is far smaller: 0.007 s must not become
    # 8 ms), then up to the ms.
    return -(-round(seconds * 1_000_000) // 1000)


# Why an if_exists="error" cannot be deferred, by the way the send is deferred.
_DECIDED_LATER = {
    "outbox": (
        "outbox=True: a relay decides the key once the transaction committed, and has no "
        "caller to raise DuplicateKey to. Use if_exists='keep' or 'replace', or send "
        "without the outbox"
    ),
    "on_commit": (
        "on_commit=True inside a transaction: the key is decided when the transaction "
        "commits, and DuplicateKey would be raised from the commit, after your data "
        "committed. Use if_exists='keep' or 'replace', or on_commit=False"
    ),
}


def refuse_deferred_error(messages: Sequence[NewMessage], deferred: str | None) -> None:
    """ConflictingOptions, with nothing written, when a message whose key would raise
    DuplicateKey (``if_exists="error"``) is sent ``deferred`` ("outbox" or "on_commit"):
    its key is decided where no caller can learn of the refusal."""
    if deferred is None:
        return
    for message in messages:
        if message.key is not None and message.if_exists == "error":
            raise ConflictingOptions(
                f"if_exists='error' (key {message.key!r}) cannot be sent with "
                f"{_DECIDED_LATER[deferred]}."
            )
