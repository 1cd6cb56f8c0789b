"""DELAYQUEUE_LOOP_BLOCKED_AFTER: how long an ``async def`` handler may hold the worker's
event loop before it is reported as blocking it (see worker.loop_watch)."""

import math
from typing import Any

from django.conf import settings

from delayqueue_django.exceptions import QueueConfigurationError

LOOP_BLOCKED_AFTER_SETTING = "DELAYQUEUE_LOOP_BLOCKED_AFTER"
# Long enough that an ordinary callback (parsing a large JSON reply, say) is not reported;
# short enough that a sync HTTP call or a time.sleep is.
DEFAULT_LOOP_BLOCKED_AFTER = 0.1


def loop_blocked_after_problem(value: Any) -> str | None:
    """What is wrong with the setting's value, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{LOOP_BLOCKED_AFTER_SETTING} must be a number of seconds, not {value!r}"
    if not math.isfinite(value) or not 0.01 <= value <= 60:
        return f"{LOOP_BLOCKED_AFTER_SETTING} must be from 0.01 to 60 seconds, not {value!r}"
    return None


def loop_blocked_after() -> float:
    value = getattr(settings, LOOP_BLOCKED_AFTER_SETTING, DEFAULT_LOOP_BLOCKED_AFTER)
    problem = loop_blocked_after_problem(value)
    if problem is not None:
        raise QueueConfigurationError(problem)
    return float(value)
