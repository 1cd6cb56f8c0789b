"""Tasks for tests/test_tasks.py. Calls are recorded in ``calls`` (the worker runs in-process)."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import suppress
from typing import Any

from django.db import DatabaseError, connections, transaction

from delayqueue_django.exceptions import Reject
from delayqueue_django.tasks.compat import TaskContext, task
from tests.task_app.models import Effect

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
async def async_where() -> str:
    """The thread it ran in: the worker's event loop's for an async task."""
    await asyncio.sleep(0)
    return threading.current_thread().name


@task
async def async_fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("async boom")


@task
def naps(seconds: float) -> None:
    """A sync task that takes its time (a handler thread is busy for ``seconds``)."""
    time.sleep(seconds)


@task
async def async_naps(seconds: float) -> None:
    """An async task that waits on nothing for ``seconds``, holding no thread."""
    await asyncio.sleep(seconds)


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


@task
def writes_then_rolls_back(database: str) -> str:
    """Writes a row, then marks its transaction (on an EXACTLY_ONCE queue, the one it runs
    in) for rollback, and returns as if all went well."""
    Effect.objects.using(database).create(message_id="writes_then_rolls_back")
    transaction.set_rollback(True, using=database)
    return "done"


@task
def writes_then_catches_an_error(database: str) -> str:
    """Writes a row, then catches a database error from a raw cursor: on PostgreSQL that
    aborts its transaction, whose COMMIT becomes a ROLLBACK."""
    Effect.objects.using(database).create(message_id="writes_then_catches_an_error")
    with suppress(DatabaseError), connections[database].cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    return "done"


@task
def writes_what_its_commit_refuses(database: str) -> str:
    """Writes a row, and one that breaks a deferred foreign key: the COMMIT of its
    transaction fails (PostgreSQL), after it returned."""
    Effect.objects.using(database).create(message_id="writes_what_its_commit_refuses")
    with connections[database].cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE dq_parent (id integer PRIMARY KEY) ON COMMIT DROP")
        cursor.execute(
            "CREATE TEMPORARY TABLE dq_orphan (parent_id integer REFERENCES dq_parent (id) "
            "DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP"
        )
        cursor.execute("INSERT INTO dq_orphan VALUES (1)")
    return "done"


# The advisory lock (PostgreSQL) that holds the COMMIT of commits_behind_a_gate.
COMMIT_GATE = 250_803


@task
def commits_behind_a_gate(database: str) -> str:
    """Writes a row; on PostgreSQL, its transaction's COMMIT then waits for the advisory
    lock COMMIT_GATE, which a deferred constraint trigger takes (a test holds it).
    Elsewhere, a COMMIT is held by other means (SQLite: another connection's read)."""
    Effect.objects.using(database).create(message_id="commits_behind_a_gate")
    if connections[database].vendor == "postgresql":
        with connections[database].cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION pg_temp.dq_gate() RETURNS trigger "
                "LANGUAGE plpgsql AS $$ BEGIN "
                f"PERFORM pg_advisory_xact_lock({COMMIT_GATE}); RETURN NULL; END $$"
            )
            cursor.execute("CREATE TEMPORARY TABLE dq_gate (id integer) ON COMMIT DROP")
            cursor.execute(
                "CREATE CONSTRAINT TRIGGER dq_gate AFTER INSERT ON dq_gate DEFERRABLE "
                "INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.dq_gate()"
            )
            cursor.execute("INSERT INTO dq_gate VALUES (1)")
    return "done"
