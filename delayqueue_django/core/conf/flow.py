"""The flow gates' options of a queue (RATE_LIMIT, MAX_IN_FLIGHT): parsed and checked, for
the settings and for ``Queue.set_rate_limit``."""

import re
from collections.abc import Mapping
from typing import Any

from delayqueue_django.core.conf.problem import SETTING, Problem

PERIOD_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
_RATE = re.compile(r"^\s*([1-9][0-9]{0,8})\s*/\s*([smh])\s*$")
# The log of a rate limit's window holds one entry per hand-out: bounded, so one fetch's
# trim of it stays short.
MAX_RATE = 1_000_000
MAX_IN_FLIGHT = 1_000_000


def parse_rate(value: Any) -> tuple[int, int] | None:
    """``"10/s"``, ``"600/m"``, ``"5000/h"`` as ``(limit, period_ms)``; None if malformed."""
    if not isinstance(value, str):
        return None
    found = _RATE.match(value)
    if found is None or int(found[1]) > MAX_RATE:
        return None
    return int(found[1]), PERIOD_MS[found[2]]


def shown_rate(rate: tuple[int, int] | None) -> str:
    """A rate as the settings spell it ("10/s"), "" for none."""
    if rate is None:
        return ""
    unit = {period: unit for unit, period in PERIOD_MS.items()}[rate[1]]
    return f"{rate[0]}/{unit}"


def rate_problem(where: str, value: Any) -> str:
    return (
        f"{where} must be a rate like '10/s', '600/m' or '5000/h' (a whole number from 1 "
        f"to {MAX_RATE} per second, minute or hour), or None; not {value!r}."
    )


def check_flow_options(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    where = f"{SETTING}[{name!r}]"
    rate, cap = options["RATE_LIMIT"], options["MAX_IN_FLIGHT"]
    if rate is not None and parse_rate(rate) is None:
        problems.append(
            Problem("delayqueue_django.E050", rate_problem(f"{where}['RATE_LIMIT']", rate))
        )
    valid_cap = cap is None or (
        isinstance(cap, int) and not isinstance(cap, bool) and 1 <= cap <= MAX_IN_FLIGHT
    )
    if not valid_cap:
        problems.append(
            Problem(
                "delayqueue_django.E051",
                f"{where}['MAX_IN_FLIGHT'] must be an int from 1 to {MAX_IN_FLIGHT}, or None "
                f"for no cap; not {cap!r}.",
            )
        )
