"""The check of a queue's HISTORY_RETENTION option: how long a message that ended leaves
its outcome record (see "Outcome records" in docs/guides/failures-and-history.md)."""

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from delayqueue_django.core.conf.problem import SETTING, Problem
from delayqueue_django.core.conf.values import _seconds_to_ms

# The longest retention taken: records are kept by Redis's own key expiry, and a retention
# past this is more likely a unit mistaken (ms for seconds) than a wish.
LONGEST_HISTORY_RETENTION = timedelta(days=3660)


def check_outcome_options(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    value = options["HISTORY_RETENTION"]
    if value is None:
        return
    ms = _seconds_to_ms(value)
    if ms is None or ms < 1 or ms > LONGEST_HISTORY_RETENTION // timedelta(milliseconds=1):
        problems.append(
            Problem(
                "delayqueue_django.E080",
                f"{SETTING}[{name!r}]['HISTORY_RETENTION'] must be a positive number of seconds "
                f"or a timedelta (at most {LONGEST_HISTORY_RETENTION.days} days), or None to "
                f"keep no outcome records; not {value!r}.",
                hint="How long a message that ended (acked, cancelled, replaced, expired or "
                "purged) leaves a record of that, e.g. timedelta(days=1).",
            )
        )


def history_retention_ms(options: Mapping[str, Any]) -> int | None:
    """HISTORY_RETENTION, checked, in whole ms, or None when no records are kept."""
    value = options["HISTORY_RETENTION"]
    return None if value is None else _seconds_to_ms(value)
