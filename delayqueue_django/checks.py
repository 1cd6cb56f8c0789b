"""System checks for DELAYQUEUES. Static: they never contact Redis, so ``migrate`` and
``check`` work with Redis down."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from delayqueue_django import conf


@register()
def check_delayqueues(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    value = conf.raw_setting()
    if isinstance(value, dict) and not value:
        return [
            Warning(
                "delayqueue_django is installed but DELAYQUEUES defines no queue.",
                hint='Add e.g. DELAYQUEUES = {"default": {"REDIS": "default", '
                '"HANDLER": "myapp.handlers.on_message"}}.',
                id="delayqueue_django.W001",
            )
        ]
    _, problems = conf.parse(value)
    return [Error(problem.msg, hint=problem.hint, id=problem.id) for problem in problems]


# Shorter tokens can be guessed; the endpoint compares in constant time but cannot rate-limit.
MIN_METRICS_TOKEN_LENGTH = 16


@register()
def check_metrics_token(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    token = getattr(settings, "DELAYQUEUE_METRICS_TOKEN", None)
    if token is None or (isinstance(token, str) and len(token) >= MIN_METRICS_TOKEN_LENGTH):
        return []
    if isinstance(token, str):
        problem = f"is {len(token)} characters long; use at least {MIN_METRICS_TOKEN_LENGTH}"
    else:
        problem = f"must be a string, not {type(token).__name__}"
    return [
        Error(
            f"DELAYQUEUE_METRICS_TOKEN {problem}.",
            hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
            id="delayqueue_django.E015",
        )
    ]


@register(deploy=True)
def check_memory_queues_in_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``check --deploy``: an in-memory queue in production loses its messages."""
    configs, _ = conf.parse(conf.raw_setting())
    return [
        Warning(
            f"DELAYQUEUES[{name!r}] keeps its messages in this process's memory "
            f"({config.url}): they are lost when the process ends, and no other process, "
            "no worker included, sees them.",
            hint="Give the queue a Redis URL or a REDIS cache alias; memory:// is for tests "
            "and quick local runs.",
            id="delayqueue_django.W002",
        )
        for name, config in configs.items()
        if config.memory_name is not None
    ]
