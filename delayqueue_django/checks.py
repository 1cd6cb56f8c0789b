"""System checks for DELAYQUEUES. Static: they never contact Redis, so ``migrate`` and
``check`` work with Redis down."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
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
