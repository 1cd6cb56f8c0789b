"""The checks of a queue's attempt-record options (HISTORY_ATTEMPTS, HISTORY_REDACT): see
docs/guides/failures-and-history.md. Whether HISTORY_REDACT imports is checked at start by
the system check ``check_history_redact`` (delayqueue_django.checks)."""

import re
from collections.abc import Mapping
from typing import Any

from delayqueue_django.core.conf.problem import SETTING, Problem
from delayqueue_django.core.conf.values import _is_int_in
from delayqueue_django.engine.history import MOST_ATTEMPTS

DOTTED_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


def check_history_options(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    where = f"{SETTING}[{name!r}]"
    if not _is_int_in(options["HISTORY_ATTEMPTS"], 0, MOST_ATTEMPTS):
        problems.append(
            Problem(
                "delayqueue_django.E085",
                f"{where}['HISTORY_ATTEMPTS'] must be an int from 0 to {MOST_ATTEMPTS}, "
                f"not {options['HISTORY_ATTEMPTS']!r}.",
                hint="How many attempt records (the error of each refused delivery) a "
                "message keeps, the newest; 0 keeps none.",
            )
        )
    redact = options["HISTORY_REDACT"]
    if redact is not None and not (isinstance(redact, str) and DOTTED_PATH.match(redact)):
        problems.append(
            Problem(
                "delayqueue_django.E086",
                f"{where}['HISTORY_REDACT'] must be the dotted path of a callable, like "
                f"'shop.history.redact', or None; not {redact!r}.",
                hint="It is called as redact(message, error) before an attempt record is "
                "stored, and returns the exception to store.",
            )
        )
