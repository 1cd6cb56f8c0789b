"""The checks of a queue's option values in ``DELAYQUEUES``: numbers and durations within
their bounds, the outbox's and exactly-once options, and the feature wings' options."""

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from delayqueue_django.core import features
from delayqueue_django.core.conf.problem import SETTING, Problem
from delayqueue_django.engine.sharding.placement import MAX_SHARDS

# Batch sizes beyond this would make single script calls long (and Lua's stack is small).
MAX_BATCH_SIZE = 10_000


def _seconds_to_ms(value: Any, *, rounded_up: bool = False) -> int | None:
    """Seconds (int, float or timedelta) as whole ms, to the nearest or ``rounded_up``; None
    if not a finite number."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    if rounded_up:
        # Through whole µs: as a float, 0.007 s is 7.000000000000001 ms.
        return -(-round(value * 1_000_000) // 1000)
    return round(value * 1000)


def _is_int_in(value: Any, low: int, high: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value <= high)
    )


def _check_numbers(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    where = f"{SETTING}[{name!r}]"
    if not _is_int_in(options["RETRY_COUNT"], 0, 1000):
        problems.append(
            Problem(
                "delayqueue_django.E009",
                f"{where}['RETRY_COUNT'] must be an int from 0 to 1000, "
                f"not {options['RETRY_COUNT']!r}.",
            )
        )
    if not _is_int_in(options["MAX_PAYLOAD_BYTES"], 1, 512 * 1024 * 1024):
        problems.append(
            Problem(
                "delayqueue_django.E009",
                f"{where}['MAX_PAYLOAD_BYTES'] must be a positive int (at most 512 MiB), "
                f"not {options['MAX_PAYLOAD_BYTES']!r}.",
            )
        )
    for option in ("FETCH_BATCH_SIZE", "STAGE_BATCH_SIZE", "SEND_BATCH_SIZE"):
        if not _is_int_in(options[option], 1, MAX_BATCH_SIZE):
            problems.append(
                Problem(
                    "delayqueue_django.E009",
                    f"{where}[{option!r}] must be an int from 1 to {MAX_BATCH_SIZE}, "
                    f"not {options[option]!r}.",
                )
            )
    consume_ms = _seconds_to_ms(options["MAX_CONSUME_DURATION"])
    if consume_ms is None or consume_ms < 1:
        problems.append(
            Problem(
                "delayqueue_django.E010",
                f"{where}['MAX_CONSUME_DURATION'] must be a positive number of seconds "
                f"or a timedelta, not {options['MAX_CONSUME_DURATION']!r}.",
            )
        )
    _check_time_limit(where, options, consume_ms, problems)
    retention = options["GARBAGE_RETENTION"]
    retention_ms = _seconds_to_ms(retention)
    if retention is not None and (retention_ms is None or retention_ms < 0):
        problems.append(
            Problem(
                "delayqueue_django.E010",
                f"{where}['GARBAGE_RETENTION'] must be a number of seconds, a timedelta, "
                f"or None to keep dead letters until removed by hand; not {retention!r}.",
            )
        )
    if not isinstance(options["SEND_ON_COMMIT"], bool):
        problems.append(
            Problem(
                "delayqueue_django.E014",
                f"{where}['SEND_ON_COMMIT'] must be True or False, "
                f"not {options['SEND_ON_COMMIT']!r}.",
            )
        )
    _check_outbox_options(where, options, problems)
    if not _is_int_in(options["SHARDS"], 1, MAX_SHARDS):
        problems.append(
            Problem(
                "delayqueue_django.E018",
                f"{where}['SHARDS'] must be an int from 1 to {MAX_SHARDS}, "
                f"not {options['SHARDS']!r}.",
                hint="1 keeps the queue in one hash tag (one Redis Cluster slot); N spreads "
                "it over N, for a queue that outgrows one Redis server.",
            )
        )
    if _nack_delays_ms(options["NACK_REDELIVERY_DELAY"]) is None:
        problems.append(
            Problem(
                "delayqueue_django.E011",
                f"{where}['NACK_REDELIVERY_DELAY'] must be seconds (number or timedelta, "
                "zero or more) or a non-empty list of them, one per retry (the last one "
                f"repeats); not {options['NACK_REDELIVERY_DELAY']!r}.",
            )
        )


def _time_limit_seconds(value: Any) -> float | None:
    """TIME_LIMIT in seconds (a timedelta too), or None when unset or not a duration."""
    ms = _seconds_to_ms(value)
    return None if value is None or ms is None else ms / 1000


def _check_time_limit(
    where: str, options: Mapping[str, Any], consume_ms: int | None, problems: list[Problem]
) -> None:
    """TIME_LIMIT, if set, is a positive duration below MAX_CONSUME_DURATION: a delivery's
    lease outlives its handler, so it is never handed to a second worker while the first
    still runs it."""
    value = options["TIME_LIMIT"]
    if value is None:
        return
    limit = _time_limit_seconds(value)
    if limit is None or limit <= 0:
        problems.append(
            Problem(
                "delayqueue_django.E023",
                f"{where}['TIME_LIMIT'] must be a positive number of seconds, a timedelta "
                f"or None (no limit), not {value!r}.",
            )
        )
    elif consume_ms is not None and consume_ms >= 1 and limit * 1000 >= consume_ms:
        problems.append(
            Problem(
                "delayqueue_django.E023",
                f"{where}['TIME_LIMIT'] ({limit:g} s) must be below MAX_CONSUME_DURATION "
                f"({consume_ms / 1000:g} s).",
                hint="Past MAX_CONSUME_DURATION the message is delivered again, to another "
                "worker, while the first still runs it: the limit must end the run before.",
            )
        )


def _read_feature_options(
    name: str, options: Mapping[str, Any], problems: list[Problem]
) -> dict[str, object] | None:
    """What each feature wing reads from its option of the queue (core.features); None if
    any reported a problem."""
    before = len(problems)

    def report(check_id: str, msg: str, hint: str | None = None) -> None:
        problems.append(Problem(f"delayqueue_django.{check_id}", msg, hint))

    read = {option: reader(name, options, report) for option, reader in features.queue_options()}
    return read if len(problems) == before else None


def _check_outbox_options(where: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    outbox = options["OUTBOX"]
    if not isinstance(outbox, bool):
        problems.append(
            Problem(
                "delayqueue_django.E030",
                f"{where}['OUTBOX'] must be True or False, not {outbox!r}.",
            )
        )
    elif outbox and options["SEND_ON_COMMIT"] is True:
        problems.append(
            Problem(
                "delayqueue_django.E031",
                f"{where} sets both OUTBOX and SEND_ON_COMMIT; a send goes through the outbox "
                "or is sent on commit, not both.",
                hint="Keep OUTBOX: the outbox also sends nothing for a transaction that rolls "
                "back, and loses nothing when Redis is down at the commit.",
            )
        )
    exactly_once = options["EXACTLY_ONCE"]
    databases = getattr(settings, "DATABASES", {})
    if not (
        isinstance(exactly_once, bool)
        or (isinstance(exactly_once, str) and exactly_once in databases)
    ):
        problems.append(
            Problem(
                "delayqueue_django.E032",
                f"{where}['EXACTLY_ONCE'] must be True, False or an alias in DATABASES, "
                f"not {exactly_once!r}.",
                hint=f"Database aliases configured: {', '.join(map(repr, databases)) or 'none'}.",
            )
        )
    retention_ms = _seconds_to_ms(options["EXACTLY_ONCE_RETENTION"])
    if retention_ms is None or retention_ms < 1:
        problems.append(
            Problem(
                "delayqueue_django.E033",
                f"{where}['EXACTLY_ONCE_RETENTION'] must be a positive number of seconds or a "
                f"timedelta, not {options['EXACTLY_ONCE_RETENTION']!r}.",
            )
        )


def _exactly_once_alias(value: Any) -> str | None:
    if value is True:
        return DEFAULT_DB_ALIAS
    return value or None


def _nack_delays_ms(value: Any) -> tuple[int, ...] | None:
    steps = value if isinstance(value, list | tuple) else [value]
    # Rounded up, as every due time is: a retry is never due before its delay has passed.
    delays = tuple(_seconds_to_ms(step, rounded_up=True) for step in steps)
    if not delays or any(delay is None or delay < 0 for delay in delays):
        return None
    return delays  # type: ignore[return-value]  # Nones were refused above.
