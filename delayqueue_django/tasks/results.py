"""Task results kept in the queue's store, readable from any process (on Redis).

One hash per result, ``{prefix:queue}:task:<result id>`` (the result id is the message id),
beside the queue's own keys: on a sharded queue, beside its message's, under the tag of the
shard the id names (the store's ``write_result`` and ``read_result`` go there); a memory
queue keeps the same record in memory. Every write
sets the TTL again, so a record lives RESULT_TTL after the last thing that happened to its
task. Fields:

    call               the task message's payload (task path, arguments, backend, queue)
    status             READY, RUNNING, SUCCESSFUL or FAILED
    started_at         first start (ISO 8601); last_attempted_at, finished_at likewise
    return_value       JSON, once SUCCESSFUL
    worker:<attempt>   the worker that ran that attempt
    error:<attempt>    JSON {exception_class_path, traceback} of that attempt's failure,
                       written when the task finishes (see below)

Attempts write fields of their own rather than appending to a list, so two overlapping
deliveries of one message (a redelivery after a timeout) never overwrite each other's.

``result.errors`` comes from the message's attempt records (``Queue.history``, written with
each refusal's verdict): one source of truth. They go when the message goes, so when the
task finishes (SUCCESSFUL after failed attempts, or FAILED) the runner copies them into the
record's ``error:<attempt>`` fields, with the last attempt's own; a reader takes an
attempt's record while there is one, else its field. On a queue that keeps no records
(HISTORY_ATTEMPTS 0) the runner writes every attempt's field, as it did before them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import ParamSpec, TypeVar

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import POSTPONE, Attempt
from delayqueue_django.tasks.call import TaskCall
from delayqueue_django.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus


class ResultRecords:
    """The result records of one queue's tasks."""

    def __init__(self, queue: Queue, ttl_seconds: int | None) -> None:
        self.queue = queue
        self.ttl_seconds = ttl_seconds

    def write(
        self, result_id: str, fields: dict[str, str], *, unless_set: dict[str, str] | None = None
    ) -> dict[str, str]:
        """Set ``fields``, and ``unless_set`` only where absent; renew the TTL; return the
        whole record. One round trip."""
        return self.queue.store.write_result(
            result_id, fields, unless_set=unless_set or {}, ttl_seconds=self.ttl_seconds
        )

    def read(self, result_id: str) -> dict[str, str]:
        return self.queue.store.read_result(result_id)


def call_fields(call: TaskCall) -> dict[str, str]:
    return {"call": json.dumps(call.to_payload(), separators=(",", ":"))}


def error_json(error: TaskError) -> str:
    return json.dumps(
        {"exception_class_path": error.exception_class_path, "traceback": error.traceback}
    )


P = ParamSpec("P")
R = TypeVar("R")


def build_result(
    task: Task[P, R],
    result_id: str,
    call: TaskCall,
    record: dict[str, str],
    history: Sequence[Attempt] = (),
) -> TaskResult[P, R]:
    """The framework's TaskResult for a record (or, with no record yet, a READY one), its
    errors from the message's attempt records (``history``) and the record's fields."""
    errors = errors_of(record, history)
    result = TaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus(record.get("status", TaskResultStatus.READY)),
        enqueued_at=call.enqueued_at_time,
        started_at=_when(record.get("started_at")),
        finished_at=_when(record.get("finished_at")),
        last_attempted_at=_when(record.get("last_attempted_at")),
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=errors,
        worker_ids=_by_attempt(record, "worker"),
    )
    if "return_value" in record:
        object.__setattr__(result, "_return_value", json.loads(record["return_value"]))
    return result


def errors_of(record: dict[str, str], history: Sequence[Attempt]) -> list[TaskError]:
    """Each failed attempt's error, in attempt order: its attempt record's (see
    ``failures``), else the record's ``error:<attempt>`` field."""
    found = {n: TaskError(**json.loads(value)) for n, value in _numbered(record, "error")}
    for attempt in failures(history):
        found[attempt.attempt] = TaskError(
            exception_class_path=attempt.error_class, traceback=attempt.traceback
        )
    return [found[n] for n in sorted(found)]


def failures(history: Sequence[Attempt]) -> list[Attempt]:
    """The attempt records of a task's failures: those with an error (a postpone is none,
    nor is a lease that ran out: the runner records TaskAbandoned for its last one)."""
    return [
        attempt
        for attempt in history
        if attempt.error_class and attempt.verdict != POSTPONE and not attempt.damaged
    ]


def error_fields(history: Sequence[Attempt]) -> dict[str, str]:
    """The attempt records' errors as the record's ``error:<attempt>`` fields: the copy
    kept when the task finishes, as the records go with its message."""
    return {
        f"error:{attempt.attempt}": error_json(
            TaskError(exception_class_path=attempt.error_class, traceback=attempt.traceback)
        )
        for attempt in failures(history)
    }


def _by_attempt(record: dict[str, str], kind: str) -> list[str]:
    """The values of the ``<kind>:<attempt>`` fields, in attempt order."""
    return [value for _, value in _numbered(record, kind)]


def _numbered(record: dict[str, str], kind: str) -> list[tuple[int, str]]:
    numbered = []
    for name, value in record.items():
        prefix, _, number = name.partition(":")
        if prefix == kind and number.isdigit():
            numbered.append((int(number), value))
    return sorted(numbered)


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
