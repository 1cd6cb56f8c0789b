"""The ``DELAYQUEUES`` setting: defaults, validation and the parsed per-queue options.

Settings are read lazily, on first use, and read again after ``setting_changed``
(``override_settings`` and pytest-django's ``settings`` fixture just work). One validator
serves both the system checks and the ``ImproperlyConfigured`` raised on use, so the two
always agree.

This module reads and parses the setting; the package's other modules are its parts: the
checks of a queue's connection options in urls (with client: the OPTIONS each redis-py
client accepts), those of its other values in values, expiry and flow (flow also parses a
rate for ``Queue.set_rate_limit``), the problems they report in problem, the hints for a
misspelt name in spelling, what a valid queue parses into in queue_config, and
DELAYQUEUE_LOOP_BLOCKED_AFTER in loop.
"""

import re
from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings

from delayqueue_django.core.conf.expiry import check_expiry_options, expires_ms
from delayqueue_django.core.conf.flow import check_flow_options, parse_rate
from delayqueue_django.core.conf.history import check_history_options
from delayqueue_django.core.conf.problem import SETTING, Problem
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.conf.spelling import meant
from delayqueue_django.core.conf.urls import _check_connection
from delayqueue_django.core.conf.values import (
    _check_numbers,
    _exactly_once_alias,
    _nack_delays_ms,
    _read_feature_options,
    _seconds_to_ms,
    _time_limit_seconds,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.exceptions import QueueConfigurationError

DEFAULTS: dict[str, Any] = {
    "REDIS": None,
    "URL": None,
    "OPTIONS": {},
    "HANDLER": None,
    "RETRY_COUNT": 3,
    "MAX_CONSUME_DURATION": 30,
    # Seconds a handler may run (None: no limit); below MAX_CONSUME_DURATION.
    "TIME_LIMIT": None,
    "NACK_REDELIVERY_DELAY": (5, 30, 120),
    "KEY_PREFIX": "delayqueue",
    "GARBAGE_RETENTION": timedelta(days=7),
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "FETCH_BATCH_SIZE": 100,
    # These two bound the longest script call, during which Redis serves nobody else: a few
    # milliseconds on a slow machine (see docs/explanation/performance.md).
    "STAGE_BATCH_SIZE": 500,
    "SEND_BATCH_SIZE": 250,
    "SEND_ON_COMMIT": False,
    # Recurring messages, by name (see delayqueue_django.schedules).
    "SCHEDULES": {},
    # Sends go through the transactional outbox (see delayqueue_django.outbox.table).
    "OUTBOX": False,
    # True or a database alias: handlers' database effects happen once per message.
    "EXACTLY_ONCE": False,
    "EXACTLY_ONCE_RETENTION": timedelta(days=7),
    # One queue over this many shards, each under its own hash tag (see engine.sharding.placement).
    "SHARDS": 1,
    # The flow gates (see docs/guides/flow-control.md): "10/s", "600/m", "5000/h" or None;
    # and the most deliveries in flight over all workers, or None.
    "RATE_LIMIT": None,
    "MAX_IN_FLIGHT": None,
    # A message not handed out this long after its due time is dead-lettered (None: never),
    # and how often a handler may postpone one message (see core.conf.expiry).
    "EXPIRES": None,
    "MAX_POSTPONES": 100,
    # Attempt records (see core.conf.history): how many a message keeps (0: none), and the
    # dotted path of what cleans an error before it is stored (None: stored as raised).
    "HISTORY_ATTEMPTS": 5,
    "HISTORY_REDACT": None,
}

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
DOTTED_PATH_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


def _check_queue(name: Any, raw: Any, problems: list[Problem]) -> QueueConfig | None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        problems.append(
            Problem(
                "delayqueue_django.E002",
                f"{SETTING} has a queue named {name!r}; names are 1 to 100 letters, digits "
                "and _ . : -",
            )
        )
        return None
    where = f"{SETTING}[{name!r}]"
    if not isinstance(raw, Mapping):
        problems.append(
            Problem(
                "delayqueue_django.E003",
                f"{where} must be a dict of options, not {type(raw).__name__}.",
            )
        )
        return None
    unknown = sorted(str(key) for key in raw if key not in DEFAULTS)
    if unknown:
        problems.append(
            Problem(
                "delayqueue_django.E004",
                f"{where} has unknown option(s) {', '.join(map(repr, unknown))}.",
                hint=_unknown_options_hint(unknown),
            )
        )
    options = {**DEFAULTS, **raw}
    before = len(problems)
    _check_connection(name, options, problems)
    _check_numbers(name, options, problems)
    check_flow_options(name, options, problems)
    check_expiry_options(name, options, problems)
    check_history_options(name, options, problems)
    handler = options["HANDLER"]
    if handler is not None and not (
        isinstance(handler, str) and DOTTED_PATH_PATTERN.match(handler)
    ):
        problems.append(
            Problem(
                "delayqueue_django.E008",
                f"{where}['HANDLER'] must be the dotted path of a callable, "
                f"like 'shop.handlers.on_message'; not {handler!r}.",
            )
        )
    prefix = options["KEY_PREFIX"]
    if not isinstance(prefix, str) or not PREFIX_PATTERN.match(prefix):
        problems.append(
            Problem(
                "delayqueue_django.E012",
                f"{where}['KEY_PREFIX'] is {prefix!r}; it must be 1 to 100 letters, digits "
                "and _ . : - (braces would break the Redis Cluster hash tag).",
            )
        )
    if len(problems) > before or unknown:
        return None
    feature_options = _read_feature_options(name, options, problems)
    if feature_options is None:
        return None
    retention = options["GARBAGE_RETENTION"]
    return QueueConfig(
        name=name,
        redis_alias=options["REDIS"],
        url=options["URL"],
        options=dict(options["OPTIONS"]),
        handler=handler,
        retry_count=options["RETRY_COUNT"],
        max_consume_ms=_seconds_to_ms(options["MAX_CONSUME_DURATION"]) or 1,
        time_limit=_time_limit_seconds(options["TIME_LIMIT"]),
        nack_delays_ms=_nack_delays_ms(options["NACK_REDELIVERY_DELAY"]) or (0,),
        key_prefix=prefix,
        garbage_retention_ms=None if retention is None else _seconds_to_ms(retention),
        max_payload_bytes=options["MAX_PAYLOAD_BYTES"],
        fetch_batch_size=options["FETCH_BATCH_SIZE"],
        stage_batch_size=options["STAGE_BATCH_SIZE"],
        send_batch_size=options["SEND_BATCH_SIZE"],
        send_on_commit=options["SEND_ON_COMMIT"],
        expires_ms=expires_ms(options),
        max_postpones=options["MAX_POSTPONES"],
        history_attempts=options["HISTORY_ATTEMPTS"],
        history_redact=options["HISTORY_REDACT"],
        feature_options=feature_options,
        outbox=options["OUTBOX"],
        exactly_once=_exactly_once_alias(options["EXACTLY_ONCE"]),
        exactly_once_retention_ms=_seconds_to_ms(options["EXACTLY_ONCE_RETENTION"]) or 1,
        shards=options["SHARDS"],
        rate_limit=parse_rate(options["RATE_LIMIT"]),
        max_in_flight=options["MAX_IN_FLIGHT"] or 0,
        raw=dict(raw),
    )


def _unknown_options_hint(unknown: list[str]) -> str:
    """E004's hint: the option each unknown one most likely misspells, and every option
    when one of them is like none."""
    guesses = {name: meant(name, DEFAULTS) for name in unknown}
    fixes = [(name, guess) for name, guess in guesses.items() if guess is not None]
    said = []
    if len(fixes) == 1 and len(unknown) == 1:
        said.append(f"Did you mean {fixes[0][1]!r}?")
    elif fixes:
        spelt = ", ".join(f"{guess!r} for {name!r}" for name, guess in fixes)
        said.append(f"Did you mean {spelt}?")
    if len(fixes) < len(unknown):
        said.append(f"Known options: {', '.join(DEFAULTS)}.")
    return " ".join(said)


def parse(value: Any) -> tuple[dict[str, QueueConfig], list[Problem]]:
    """Validate a ``DELAYQUEUES`` value; returns the valid queues and every problem found."""
    problems: list[Problem] = []
    if not isinstance(value, Mapping):
        problems.append(
            Problem(
                "delayqueue_django.E001",
                f"{SETTING} must be a dict mapping queue names to options, "
                f"not {type(value).__name__}.",
            )
        )
        return {}, problems
    configs = {}
    for name, raw in value.items():
        config = _check_queue(name, raw, problems)
        if config is not None:
            configs[name] = config
    _check_shared_keys(configs, problems)
    return configs, problems


def _check_shared_keys(configs: Mapping[str, QueueConfig], problems: list[Problem]) -> None:
    """Two queues on one server whose keys coincide would share every message: a queue's
    keys start with ``{KEY_PREFIX:name}``, the same for prefix "dq:a" with queue "b" as for
    prefix "dq" with queue "a:b". Queues on different servers may share a tag."""
    seen: dict[tuple[str, str], str] = {}
    for name, config in configs.items():
        tag, server = QueueKeys(config.key_prefix, name).tag, _server_of(config)
        first = seen.setdefault((server, tag), name)
        if first == name:
            continue
        other = configs[first]
        problems.append(
            Problem(
                "delayqueue_django.E016",
                f"{SETTING}[{first!r}] (KEY_PREFIX {other.key_prefix!r}) and {SETTING}[{name!r}] "
                f"(KEY_PREFIX {config.key_prefix!r}) are on the same server and would share "
                f"its keys {tag}:…, and with them every message.",
                hint="Give one of them another KEY_PREFIX or name: queues on one server need "
                "distinct {KEY_PREFIX:name}.",
            )
        )


def _server_of(config: QueueConfig) -> str:
    """Where a queue's keys live, as far as the settings can tell without connecting: its
    URL, or its cache's LOCATION (the first one, which django-redis writes to). Compared as
    text: two spellings of one server (a host name and its address) are not recognised.
    Never shown: a URL may hold a password."""
    if config.url is not None:
        return config.url
    location = getattr(settings, "CACHES", {})[config.redis_alias].get("LOCATION")
    if isinstance(location, str):
        location = re.split("[;,]", location)
    if isinstance(location, list | tuple) and location and isinstance(location[0], str):
        return location[0].strip()
    return f"cache {config.redis_alias!r}"


def raw_setting() -> Any:
    return getattr(settings, SETTING, {})


@cache
def queue_configs() -> dict[str, QueueConfig]:
    """Every configured queue; raises QueueConfigurationError if the setting is invalid."""
    configs, problems = parse(raw_setting())
    if problems:
        listing = "\n".join(f"{p.id}: {p.msg}" for p in problems)
        raise QueueConfigurationError(f"{SETTING} is invalid:\n{listing}")
    return configs


def reset() -> None:
    """Forget the parsed setting (called when settings change)."""
    queue_configs.cache_clear()
