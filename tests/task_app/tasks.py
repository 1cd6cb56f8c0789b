"""Tasks for tests/test_tasks.py. Calls are recorded in ``calls`` (the worker runs in-process)."""

from __future__ import annotations

import asyncio
from typing import Any

from delayqueue_django.exceptions import Reject
from delayqueue_django.tasks.compat import TaskContext, task

calls: list[tuple[str, Any]] = []
# How many more times ``flaky`` fails before it succeeds.
flaky_failures_left = {"n": 0}
# Whether importing ``unimportable`` calls sys.exit() rather than raising RuntimeError.
unimportable_exits = {"exit": False}


@task
def add(a: int, b: int) -> int:
    calls.append(("add", (a, b)))
    return a + b


@task
def always_fails(reason: str) -> None:
    calls.append(("always_fails", reason))
    raise ValueError(reason)


@task
def flaky() -> str:
    calls.append(("flaky", None))
    if flaky_failures_left["n"] > 0:
        flaky_failures_left["n"] -= 1
        raise RuntimeError("not yet")
    return "finally"


@task(takes_context=True)
def which_attempt(context: TaskContext[[], int]) -> int:
    return context.attempt


@task
async def async_double(n: int) -> int:
    await asyncio.sleep(0)
    return n * 2


@task
def returns_something_json_cannot_carry() -> Any:
    return object()


@task(backend="second", queue_name="second")
def multiply(a: int, b: int) -> int:
    calls.append(("multiply", (a, b)))
    return a * b


@task(backend="elsewhere")
def declared_elsewhere() -> None:
    """A task of a backend of another kind (test_tasks configures "elsewhere" so): a
    DelayQueueBackend must never run it."""
    calls.append(("declared_elsewhere", None))


def not_a_task() -> None:
    """A plain function: a message naming it must never get it called."""
    calls.append(("not_a_task", None))


@task
def rejects(reason: str) -> None:
    """Refuses its call for good: Reject dead-letters the message whatever retries are left."""
    calls.append(("rejects", reason))
    raise Reject(reason)
