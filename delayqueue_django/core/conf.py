"""The ``DELAYQUEUES`` setting: defaults, validation and the parsed per-queue options.

Settings are read lazily, on first use, and read again after ``setting_changed``
(``override_settings`` and pytest-django's ``settings`` fixture just work). One validator
serves both the system checks and the ``ImproperlyConfigured`` raised on use, so the two
always agree.
"""

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from delayqueue_django.core import client_options, features
from delayqueue_django.core.client_options import CLUSTER_URL_SCHEMES
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.shards import MAX_SHARDS
from delayqueue_django.exceptions import QueueConfigurationError

SETTING = "DELAYQUEUES"

DEFAULTS: dict[str, Any] = {
    "REDIS": None,
    "URL": None,
    "OPTIONS": {},
    "HANDLER": None,
    "RETRY_COUNT": 3,
    "MAX_CONSUME_DURATION": 30,
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
    # One queue over this many shards, each under its own hash tag (see engine.shards).
    "SHARDS": 1,
}

URL_SCHEMES = ("redis", "rediss", "unix")
# "memory://" or "memory://name": the in-process store, for tests and quick local runs.
MEMORY_URL_PREFIX = "memory://"

# Batch sizes beyond this would make single script calls long (and Lua's stack is small).
MAX_BATCH_SIZE = 10_000

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
MEMORY_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{0,100}$")
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
DOTTED_PATH_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting, as a system check and an exception will word it."""

    id: str
    msg: str
    hint: str | None = None


@dataclass(frozen=True)
class QueueConfig:
    """The options of one queue, validated, with defaults filled in and durations in ms."""

    name: str
    redis_alias: str | None
    url: str | None
    options: Mapping[str, Any]
    handler: str | None
    retry_count: int
    max_consume_ms: int
    nack_delays_ms: tuple[int, ...]
    key_prefix: str
    garbage_retention_ms: int | None
    max_payload_bytes: int
    fetch_batch_size: int
    stage_batch_size: int
    send_batch_size: int
    send_on_commit: bool
    # What the feature wings read from their options (core.features), by option name.
    feature_options: Mapping[str, object] = field(default_factory=dict)
    outbox: bool = False
    # The database alias processed message ids are recorded in, or None: at least once.
    exactly_once: str | None = None
    exactly_once_retention_ms: int = 7 * 24 * 3600 * 1000
    # The layout new messages are spread over (1: the queue's one set of keys).
    shards: int = 1
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def memory_name(self) -> str | None:
        """The in-memory store's name for a ``memory://name`` URL ("" for ``memory://``), or
        None for a queue on Redis."""
        if self.url is None or not self.url.startswith(MEMORY_URL_PREFIX):
            return None
        return self.url.removeprefix(MEMORY_URL_PREFIX)

    def nack_delay_ms(self, attempt: int) -> int:
        """The wait before retrying a delivery that failed on ``attempt`` (1-based)."""
        delays = self.nack_delays_ms
        return delays[min(max(attempt, 1), len(delays)) - 1]


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


def _check_connection(name: str, options: Mapping[str, Any], problems: list[Problem]) -> None:
    alias, url = options["REDIS"], options["URL"]
    where = f"{SETTING}[{name!r}]"
    if (alias is None) == (url is None):
        problems.append(
            Problem(
                "delayqueue_django.E005",
                f"{where} must set exactly one of REDIS (a django-redis cache alias) and URL.",
                hint='e.g. "REDIS": "default" or "URL": "redis://127.0.0.1:6379/0"',
            )
        )
        return
    if alias is not None:
        caches = getattr(settings, "CACHES", {})
        backend = caches.get(alias, {}).get("BACKEND", "") if isinstance(alias, str) else ""
        if not isinstance(alias, str) or alias not in caches:
            problems.append(
                Problem(
                    "delayqueue_django.E006",
                    f"{where}['REDIS'] is {alias!r}, which is not an alias in CACHES.",
                    hint=f"Cache aliases configured: {', '.join(map(repr, caches)) or 'none'}.",
                )
            )
        elif not backend.startswith("django_redis."):
            problems.append(
                Problem(
                    "delayqueue_django.E006",
                    f"{where}['REDIS'] names cache {alias!r}, whose BACKEND {backend!r} "
                    "is not django-redis.",
                    hint='Use "BACKEND": "django_redis.cache.RedisCache", or give the queue '
                    "a URL instead.",
                )
            )
        if options["OPTIONS"]:
            problems.append(
                Problem(
                    "delayqueue_django.E013",
                    f"{where}['OPTIONS'] only applies with URL; a REDIS alias uses the "
                    "cache's own connection options.",
                )
            )
        return
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    if scheme == "memory":
        _check_memory_url(where, url, options, problems)
        return
    if scheme not in URL_SCHEMES + CLUSTER_URL_SCHEMES:
        allowed = ", ".join(f"{s}://" for s in URL_SCHEMES + CLUSTER_URL_SCHEMES)
        problems.append(
            Problem(
                "delayqueue_django.E007",
                f"{where}['URL'] is {url!r}; it must start with one of {allowed}, "
                f"{MEMORY_URL_PREFIX}.",
                hint="redis+cluster://host:port connects to a Redis Cluster; memory:// keeps "
                "the queue in this process, for tests and quick local runs.",
            )
        )
    if not isinstance(options["OPTIONS"], Mapping):
        problems.append(
            Problem(
                "delayqueue_django.E013",
                f"{where}['OPTIONS'] must be a dict of redis-py connection arguments, "
                f"not {type(options['OPTIONS']).__name__}.",
            )
        )
    elif scheme in URL_SCHEMES + CLUSTER_URL_SCHEMES:
        _check_client_options(where, url, options["OPTIONS"], problems)


def _check_client_options(
    where: str, url: str, options: Mapping[Any, Any], problems: list[Problem]
) -> None:
    """OPTIONS names the redis-py client would refuse at its first connection (or, on Redis
    Cluster, drop without a word), read from the installed redis-py's signatures."""
    try:
        unknown = client_options.unknown_options(url, options)
    except ValueError as error:
        problems.append(
            Problem(
                "delayqueue_django.E007",
                f"{where}['URL'] is {url!r}, which redis-py cannot read: {error}",
            )
        )
        return
    if not unknown:
        return
    accepted = sorted(client_options.accepted_options(url, options))
    guesses = [
        guess
        for name in unknown
        if isinstance(name, str)
        for guess in difflib.get_close_matches(name, accepted, n=1)
    ]
    hint = (
        f"Did you mean {', '.join(map(repr, guesses))}?"
        if guesses
        else f"It accepts: {', '.join(accepted)}."
    )
    problems.append(
        Problem(
            "delayqueue_django.E017",
            f"{where}['OPTIONS'] has {', '.join(map(repr, unknown))}, which redis-py's "
            f"{client_options.client_description(url)} client does not accept.",
            hint=hint,
        )
    )


def _check_memory_url(
    where: str, url: str, options: Mapping[str, Any], problems: list[Problem]
) -> None:
    name = url.removeprefix(MEMORY_URL_PREFIX)
    if not url.startswith(MEMORY_URL_PREFIX) or not MEMORY_NAME_PATTERN.match(name):
        problems.append(
            Problem(
                "delayqueue_django.E007",
                f"{where}['URL'] is {url!r}; an in-memory store is memory:// or memory://name, "
                "the name being up to 100 letters, digits and _ . : -",
            )
        )
    if options["OPTIONS"]:
        problems.append(
            Problem(
                "delayqueue_django.E013",
                f"{where}['OPTIONS'] only applies to a Redis URL; an in-memory store takes "
                "no connection options.",
            )
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
                hint=f"Known options: {', '.join(DEFAULTS)}.",
            )
        )
    options = {**DEFAULTS, **raw}
    before = len(problems)
    _check_connection(name, options, problems)
    _check_numbers(name, options, problems)
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
        nack_delays_ms=_nack_delays_ms(options["NACK_REDELIVERY_DELAY"]) or (0,),
        key_prefix=prefix,
        garbage_retention_ms=None if retention is None else _seconds_to_ms(retention),
        max_payload_bytes=options["MAX_PAYLOAD_BYTES"],
        fetch_batch_size=options["FETCH_BATCH_SIZE"],
        stage_batch_size=options["STAGE_BATCH_SIZE"],
        send_batch_size=options["SEND_BATCH_SIZE"],
        send_on_commit=options["SEND_ON_COMMIT"],
        feature_options=feature_options,
        outbox=options["OUTBOX"],
        exactly_once=_exactly_once_alias(options["EXACTLY_ONCE"]),
        exactly_once_retention_ms=_seconds_to_ms(options["EXACTLY_ONCE_RETENTION"]) or 1,
        shards=options["SHARDS"],
        raw=dict(raw),
    )


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
