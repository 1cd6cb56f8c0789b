"""Where a queue's Redis is, as ``DELAYQUEUES`` says it: a django-redis cache alias
(``REDIS``), a ``URL`` (Redis, a Cluster, Sentinel, or ``memory://``), and the ``OPTIONS``
its client accepts."""

import difflib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from delayqueue_django.core.conf import client as client_options
from delayqueue_django.core.conf.client import CLUSTER_URL_SCHEMES
from delayqueue_django.core.conf.problem import SETTING, Problem

URL_SCHEMES = ("redis", "rediss", "unix")
# "memory://" or "memory://name": the in-process store, for tests and quick local runs.
MEMORY_URL_PREFIX = "memory://"

MEMORY_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{0,100}$")


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
