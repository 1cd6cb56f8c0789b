"""DELAYQUEUE_OUTBOX_DATABASES: the databases whose outbox tables relays read, and where
send(outbox=True) may write."""

from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from delayqueue_django.core.conf.problem import Problem
from delayqueue_django.exceptions import QueueConfigurationError

# The databases whose outbox tables relays read, and where send(outbox=True) may write.
OUTBOX_DATABASES_SETTING = "DELAYQUEUE_OUTBOX_DATABASES"


def outbox_databases() -> list[str]:
    """The database aliases of DELAYQUEUE_OUTBOX_DATABASES (default: the default one)."""
    value = getattr(settings, OUTBOX_DATABASES_SETTING, [DEFAULT_DB_ALIAS])
    problem = outbox_databases_problem(value)
    if problem:
        raise QueueConfigurationError(problem.msg)
    return list(value)


def outbox_databases_problem(value: Any) -> Problem | None:
    databases = getattr(settings, "DATABASES", {})
    if isinstance(value, list | tuple) and all(
        isinstance(alias, str) and alias in databases for alias in value
    ):
        return None
    return Problem(
        "delayqueue_django.E034",
        f"{OUTBOX_DATABASES_SETTING} must be a list of aliases in DATABASES, not {value!r}.",
        hint=f"Database aliases configured: {', '.join(map(repr, databases)) or 'none'}.",
    )
