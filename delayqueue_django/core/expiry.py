"""A send's ``expires`` for the store: when a message not handed out yet is dead-lettered
instead (see "Expiry" in docs/guides/flow-control.md)."""

import time
from datetime import datetime, timedelta
from typing import Any

from delayqueue_django.core.encoding import _at_ms, delay_in_us
from delayqueue_django.engine.errors import InvalidExpiry
from delayqueue_django.exceptions import InvalidDelay


def expiry_spec(
    expires: Any, at_ms: int | None, delay_us: int, default_ms: int | None
) -> tuple[int | None, int]:
    """``(expires_at_ms, expires_in_us)`` for NewMessage, from a send's due time (``at_ms``
    or ``delay_us``, see due_spec) and its ``expires``: a datetime (an absolute time), or
    seconds or a timedelta counted from the send, on Redis's clock as a delay is. Without
    one, the queue's EXPIRES (``default_ms``) counts from the due time. Raises InvalidExpiry
    for an expiry in the past or not after the due time (this machine's clock judges what
    it can; the store refuses, with nothing written, what it cannot)."""
    if expires is None:
        if default_ms is None:
            return None, 0
        if at_ms is not None:
            return max(at_ms, _now_ms()) + default_ms, 0
        return None, delay_us + default_ms * 1000
    if isinstance(expires, datetime):
        try:
            expires_at = _at_ms(expires)
        except InvalidDelay as error:
            raise InvalidExpiry(str(error).replace("at=", "expires=", 1)) from None
        due_ms = at_ms if at_ms is not None else _now_ms() + -(-delay_us // 1000)
        if expires_at <= _now_ms():
            raise InvalidExpiry(f"expires={expires!r} is in the past; nothing was written")
        if expires_at <= due_ms:
            raise InvalidExpiry(
                f"expires={expires!r} is not after the message's due time, so it could never "
                "be handed out; nothing was written"
            )
        return expires_at, 0
    if isinstance(expires, bool) or not isinstance(expires, int | float | timedelta):
        raise InvalidExpiry(
            "expires must be a number of seconds, a timedelta or a datetime, "
            f"not {type(expires).__name__}"
        )
    try:
        in_us = delay_in_us(expires)
    except InvalidDelay as error:
        raise InvalidExpiry(str(error).replace("delay", "expires", 1)) from None
    if in_us <= 0:
        raise InvalidExpiry(f"expires={expires!r} is not in the future; nothing was written")
    if at_ms is None and in_us <= delay_us:
        raise InvalidExpiry(
            f"expires={expires!r} is not longer than the delay, so the message could never be "
            "handed out; nothing was written"
        )
    if at_ms is not None and _now_ms() + in_us // 1000 <= at_ms:
        raise InvalidExpiry(
            f"expires={expires!r} ends at or before the message's due time, so it could "
            "never be handed out; nothing was written"
        )
    return None, in_us


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
