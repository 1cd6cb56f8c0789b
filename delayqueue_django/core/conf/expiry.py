"""The checks of a queue's expiry and postpone options (EXPIRES, MAX_POSTPONES): see
"Expiry" and "Postpone and Retry from a handler" in docs/guides/flow-control.md."""

from collections.abc import Mapping
from typing import Any

from delayqueue_django.core.conf.problem import SETTING, Problem
from delayqueue_django.core.conf.values import _is_int_in, _seconds_to_ms

# The most postpones one message may be given (a bound on a bound: a million postpones of
# a second each is eleven days).
LARGEST_MAX_POSTPONES = 1_000_000


def check_expiry_options(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    where = f"{SETTING}[{name!r}]"
    expires = options["EXPIRES"]
    expires_ms = _seconds_to_ms(expires, rounded_up=True)
    if expires is not None and (expires_ms is None or expires_ms < 1):
        problems.append(
            Problem(
                "delayqueue_django.E060",
                f"{where}['EXPIRES'] must be a positive number of seconds, a timedelta, or "
                f"None for messages that never expire; not {expires!r}.",
                hint="It counts from each message's due time: a message not handed out "
                "within it is dead-lettered with the reason 'expired'.",
            )
        )
    if not _is_int_in(options["MAX_POSTPONES"], 0, LARGEST_MAX_POSTPONES):
        problems.append(
            Problem(
                "delayqueue_django.E061",
                f"{where}['MAX_POSTPONES'] must be an int from 0 to {LARGEST_MAX_POSTPONES}, "
                f"not {options['MAX_POSTPONES']!r}.",
                hint="How often a handler may postpone one message (raise Postpone) before "
                "it is dead-lettered with the reason 'postponed too often'.",
            )
        )


def expires_ms(options: Mapping[str, Any]) -> int | None:
    """EXPIRES, checked, in whole ms (rounded up), or None."""
    value = options["EXPIRES"]
    return None if value is None else _seconds_to_ms(value, rounded_up=True)
