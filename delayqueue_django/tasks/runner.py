"""Running task messages in ``run_delayqueue``: the handler of every task queue.

Status moves READY → RUNNING → SUCCESSFUL, or back to READY while retries are left, or to
FAILED on the last attempt. The queue's own retry rules apply (RETRY_COUNT,
NACK_REDELIVERY_DELAY); each attempt's worker and error are recorded.

A task may raise ``Postpone`` (back to READY, no attempt used, no error recorded) or
``Retry`` (a failed attempt, retried after its own delay), as any handler may. A task
message that expires (the queue's EXPIRES) is FAILED with ``TaskExpired``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.dispatch import receiver
from django.utils import timezone

from delayqueue_django.core import features, time_limits
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Exhausted
from delayqueue_django.core.registry import get_queue
from delayqueue_django.engine import Attempt, loggable
from delayqueue_django.exceptions import Postpone, Reject, TaskAbandoned, TaskExpired
from delayqueue_django.signals import message_exhausted, message_expired
from delayqueue_django.tasks.backend import DelayQueueBackend
from delayqueue_django.tasks.call import TaskCall
from delayqueue_django.tasks.claims import task_queue_names
from delayqueue_django.tasks.compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from delayqueue_django.tasks.locate import NOT_A_TASK, UnknownTask, enqueued_task
from delayqueue_django.tasks.results import build_result, call_fields, error_fields, error_json

logger = logging.getLogger("delayqueue_django.tasks")

# The framework keeps worker ids of up to 64 characters.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"[-64:]


@dataclass(frozen=True, slots=True)
class _Run:
    """A task message taken up: its call, backend, task, records and result so far."""

    message: Message
    call: TaskCall
    backend: DelayQueueBackend
    task: Task[..., Any]
    records: Any
    result: Any

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        if self.task.takes_context:
            return [TaskContext(task_result=self.result), *self.call.args], self.call.kwargs
        return list(self.call.args), self.call.kwargs


def run_task(message: Message) -> None:
    """Run the task a message names; raise to have the worker retry it (or bury it)."""
    run = _take_up(message)
    task_started.send(sender=type(run.backend), task_result=run.result)
    try:
        args, kwargs = run.arguments()
        returned = _as_json(run.task.call(*args, **kwargs))
        # On an EXACTLY_ONCE queue the task ran in a transaction: one that will roll back
        # (set_rollback, an error caught inside it) is this attempt's failure; its success
        # would be recorded while nothing it wrote is committed.
        features.handler_transaction().raise_if_rolled_back(message)
    except Postpone:
        # Not a failure: the task waits again, and its attempt is given back.
        run.records.write(message.id, {"status": TaskResultStatus.READY})
        raise
    except BaseException as error:  # the task's failure, whatever it is, is its outcome
        _record_failure(*_failure_of(run, error), message=message)
        raise
    # Recorded before the COMMIT (a worker that dies after it finds the message processed
    # and runs it no more): if that COMMIT then fails, the attempt is recorded as failed.
    features.handler_transaction().on_rollback(
        lambda error: _record_failure(
            run.backend,
            run.task,
            run.call,
            message.id,
            message.attempt,
            error,
            last=message.is_last_attempt,
            message=message,
        )
    )
    succeeded = {**_succeeded(returned), **error_fields(_history(message.queue, message))}
    record = run.records.write(message.id, succeeded)
    features.handler_transaction().on_commit(
        lambda: _finish_committed(run.backend, run.task, run.call, message, succeeded, record)
    )


async def arun_task(message: Message) -> None:
    """``run_task`` for an ``async def`` task, on the worker's event loop (never on an
    EXACTLY_ONCE queue: see loop_handler). The task is awaited; the framework's signals
    are sent with ``asend`` (sync receivers run in a thread, as async code must call them);
    the result's records are short Redis writes, made as they are."""
    run = _take_up(message)
    await task_started.asend(sender=type(run.backend), task_result=run.result)
    try:
        args, kwargs = run.arguments()
        returned = _as_json(await run.task.acall(*args, **kwargs))
    except Postpone:
        run.records.write(message.id, {"status": TaskResultStatus.READY})
        raise
    except BaseException as error:
        failure = _failure_of(run, _cancelled_at_limit(message, error))
        finished = _write_failure(*failure, message=message)
        if finished is not None:
            await task_finished.asend(sender=type(run.backend), task_result=finished)
        raise
    succeeded = {**_succeeded(returned), **error_fields(_history(message.queue, message))}
    record = run.records.write(message.id, succeeded)
    result = _final_result(run.backend, run.task, run.call, message, succeeded, record)
    await task_finished.asend(sender=type(run.backend), task_result=result)


def _cancelled_at_limit(message: Message, error: BaseException) -> BaseException:
    """The worker's cancellation at TIME_LIMIT reaches the task as asyncio.CancelledError,
    and fails the attempt as TimeLimitExceeded (see worker.async_handling): the record
    says the same."""
    limit = get_queue(message.queue).config.time_limit
    if isinstance(error, asyncio.CancelledError) and limit is not None and message.time_left() == 0:
        exceeded = time_limits.cancelled_at(limit)
        exceeded.__cause__ = error
        return exceeded
    return error


def loop_handler(message: Message) -> Callable[[Message], Any] | None:
    """``arun_task`` if the message's task is ``async def`` and its queue is not
    EXACTLY_ONCE (whose transaction cannot hold an await: there the task runs in a handler
    thread through async_to_sync, as before); else None: ``run_task`` in a thread. A
    message that is no task is refused by run_task."""
    if get_queue(message.queue).config.exactly_once:
        return None
    try:
        _, _, task = _task_of(message.payload, message.queue)
    except NOT_A_TASK:
        return None
    return arun_task if iscoroutinefunction(task.func) else None


class TaskHandler:
    """The handler of every task queue: ``run_task`` in a handler thread, or ``arun_task``
    on the worker's event loop for an ``async def`` task (see loop_handler)."""

    def __init__(self) -> None:
        self.__module__ = __name__
        self.__qualname__ = "run_task"

    def __call__(self, message: Message) -> None:
        run_task(message)

    def loop_handler(self, message: Message) -> Callable[[Message], Any] | None:
        return loop_handler(message)


task_handler = TaskHandler()


def _take_up(message: Message) -> _Run:
    """The task of the message, its record written RUNNING for this attempt; a message
    that is no task is rejected (dead at once: retrying cannot make it one)."""
    try:
        call, backend, task = _task_of(message.payload, message.queue)
    except NOT_A_TASK as error:
        if error.__cause__ is not None:  # the task's module raised as it was imported
            logger.error(
                "the task of message id=%s queue=%s failed to import",
                loggable(message.id),
                message.queue,
                exc_info=error.__cause__,
            )
        # Bury at once: retrying cannot make a message into a task.
        # Its text is logged as the rejection's reason.
        raise Reject(f"refusing to run message {loggable(message.id)} as a task: {error}") from None

    records = backend.records(get_queue(message.queue))
    now = timezone.now().isoformat()
    record = records.write(
        message.id,
        {
            **call_fields(call),
            "status": TaskResultStatus.RUNNING,
            "last_attempted_at": now,
            f"worker:{message.attempt}": WORKER_ID,
        },
        unless_set={"started_at": now},
    )
    result = build_result(task, message.id, call, record, _history(message.queue, message))
    return _Run(message, call, backend, task, records, result)


def _history(queue_name: str, message: Message) -> list[Attempt]:
    """The message's attempt records, read only when it may have some (a retry)."""
    queue = get_queue(queue_name)
    if message.attempt <= 1 or not queue.config.history_attempts:
        return []
    return queue.history(message.id)


def _as_json(value: Any) -> str:
    """The task's return value as its result keeps it: one JSON cannot carry fails the run
    (raised inside the run's try), as it would fail every reader of the result."""
    return json.dumps(normalize_json(value), separators=(",", ":"))


def _succeeded(returned: str) -> dict[str, str]:
    return {
        "status": TaskResultStatus.SUCCESSFUL,
        "finished_at": timezone.now().isoformat(),
        "return_value": returned,
    }


def _failure_of(run: _Run, error: BaseException) -> tuple[Any, ...]:
    """_record_failure's arguments for the run's failure: Reject buries the message
    whatever retries are left, so its attempt is the last."""
    last = run.message.is_last_attempt or isinstance(error, Reject)
    return (run.backend, run.task, run.call, run.message.id, run.message.attempt, error, last)


def _finish_committed(
    backend: DelayQueueBackend,
    task: Task[..., Any],
    call: TaskCall,
    message: Message,
    succeeded: dict[str, str],
    record: dict[str, str],
) -> None:
    """The run's transaction committed (at once outside EXACTLY_ONCE): send task_finished.

    On the last attempt, the exhaustion's announcement (fail_abandoned_task) may have come
    meanwhile, if the run outlived its lease: between its SUCCESSFUL and its COMMIT, it
    found no processed record yet and recorded FAILED. The commit proves the run's
    success: it is written again. (An announcement that looks after the COMMIT finds the
    record, and fixes a FAILED it wrote itself; see fail_abandoned_task.)"""
    result = _final_result(backend, task, call, message, succeeded, record)
    task_finished.send(sender=type(backend), task_result=result)


def _final_result(
    backend: DelayQueueBackend,
    task: Task[..., Any],
    call: TaskCall,
    message: Message,
    succeeded: dict[str, str],
    record: dict[str, str],
) -> Any:
    """The successful run's result, its SUCCESSFUL written again on the last attempt if
    the exhaustion's announcement wrote FAILED meanwhile (see _finish_committed)."""
    if message.is_last_attempt:
        records = backend.records(get_queue(message.queue))
        if records.read(message.id).get("status") != TaskResultStatus.SUCCESSFUL:
            record = records.write(message.id, succeeded)
    return build_result(task, message.id, call, record)


def finish_processed_task(message: Message) -> None:
    """A task message acked without running, as its EXACTLY_ONCE transaction committed
    before: its result says SUCCESSFUL. A redelivery after a worker died past its COMMIT
    finds it so already; after a COMMIT whose reply was lost (the server committed, the
    worker got an error and recorded a failed attempt), this makes the result final."""
    try:
        call, backend, task = _task_of(message.payload, message.queue)
    except NOT_A_TASK:
        return
    _record_committed(backend, task, call, message.id)


def _record_committed(
    backend: DelayQueueBackend, task: Task[..., Any], call: TaskCall, result_id: str
) -> None:
    """The task's transaction committed (its processed record proves it): record SUCCESSFUL,
    whatever was recorded since, and send task_finished, unless it says so already.

    The return value is the one the committed run wrote with its SUCCESSFUL, just before its
    COMMIT: a failure recorded after leaves it in the record. A record that lost it (its
    RESULT_TTL ran out before the redelivery) is written anew, with None for return value."""
    records = backend.records(get_queue(call.queue_name))
    if records.read(result_id).get("status") == TaskResultStatus.SUCCESSFUL:
        return
    now = timezone.now().isoformat()
    record = records.write(
        result_id,
        {"status": TaskResultStatus.SUCCESSFUL},
        unless_set={**call_fields(call), "finished_at": now, "return_value": "null"},
    )
    result = build_result(task, result_id, call, record)
    task_finished.send(sender=type(backend), task_result=result)


@receiver(message_exhausted)
def fail_abandoned_task(sender: Any, queue: str, message: Exhausted, **kwargs: Any) -> None:
    """A task whose last delivery timed out or whose worker died never said how it ended:
    record it as FAILED, so its result does not stay RUNNING for good. On an EXACTLY_ONCE
    queue, a processed record proves it succeeded instead: SUCCESSFUL it stays, or is
    made."""
    if queue not in task_queue_names():
        return
    try:
        call, backend, task = _task_of(message.payload, queue)
    except NOT_A_TASK:
        return  # refused as a task when it was delivered; nothing ran, nothing to record
    record = backend.records(get_queue(queue)).read(message.id)
    status = record.get("status")
    handler_transaction = features.handler_transaction()
    # On an EXACTLY_ONCE queue SUCCESSFUL is written just before the COMMIT: a worker that
    # died between the two left it, with nothing committed, if no processed record says so.
    if status == TaskResultStatus.SUCCESSFUL and handler_transaction.committed(queue, message.id):
        return
    if status != TaskResultStatus.FAILED:
        abandoned = TaskAbandoned(
            f"the task's last delivery (attempt {message.attempt}) ended without an outcome: "
            "its worker stopped, or it ran past the queue's MAX_CONSUME_DURATION"
        )
        # The record may never have been written (the task never started): write the call.
        _record_failure(
            backend, task, call, message.id, message.attempt, abandoned, last=True, with_call=True
        )
    # Looked at after that write: a processed record proves the run succeeded, whatever the
    # result says (a COMMIT that came since, or whose reply was lost: a failure recorded).
    if get_queue(queue).config.exactly_once and handler_transaction.committed(queue, message.id):
        _record_committed(backend, task, call, message.id)


@receiver(message_expired)
def fail_expired_task(sender: Any, queue: str, message: Exhausted, **kwargs: Any) -> None:
    """A task whose message expired (its queue's EXPIRES) before a worker took it, or
    before its retry was due, will not run: record it as FAILED."""
    if queue not in task_queue_names():
        return
    try:
        call, backend, task = _task_of(message.payload, queue)
    except NOT_A_TASK:
        return
    if backend.records(get_queue(queue)).read(message.id).get("status") in (
        TaskResultStatus.FAILED,
        TaskResultStatus.SUCCESSFUL,
    ):
        return
    expired = TaskExpired(
        f"the task's message expired after attempt {message.attempt}, before it could run"
    )
    _record_failure(
        backend, task, call, message.id, message.attempt, expired, last=True, with_call=True
    )


def _task_of(payload: Any, queue: str) -> tuple[TaskCall, DelayQueueBackend, Task[..., Any]]:
    """The call a message carries, its backend and its task as enqueued (that backend's,
    validated by it); raises one of NOT_A_TASK."""
    call = TaskCall.from_payload(payload)
    backend = _backend_for(call, queue)
    return call, backend, enqueued_task(call)


def _record_failure(
    backend: DelayQueueBackend,
    task: Task[..., Any],
    call: TaskCall,
    result_id: str,
    attempt: int,
    error: BaseException,
    last: bool,
    *,
    with_call: bool = False,
    message: Message | None = None,
) -> None:
    """Record an attempt's error: READY again while retries are left, else FAILED, which
    finishes the task (task_finished)."""
    finished = _write_failure(
        backend, task, call, result_id, attempt, error, last, with_call=with_call, message=message
    )
    if finished is not None:
        task_finished.send(sender=type(backend), task_result=finished)


def _write_failure(
    backend: DelayQueueBackend,
    task: Task[..., Any],
    call: TaskCall,
    result_id: str,
    attempt: int,
    error: BaseException,
    last: bool,
    *,
    with_call: bool = False,
    message: Message | None = None,
) -> Any:
    """Record a failed attempt; the finished result to announce if it was the last, else
    None. The error of an attempt before the last is its attempt record's, written with
    its verdict; the last one copies them with its own (see tasks.results)."""
    queue = get_queue(call.queue_name)
    keeps_records = queue.config.history_attempts > 0
    fields = {
        **(call_fields(call) if with_call else {}),
        "status": TaskResultStatus.FAILED if last else TaskResultStatus.READY,
    }
    if not last:
        if not keeps_records:
            fields[f"error:{attempt}"] = error_json(_task_error(queue, message, error))
        backend.records(queue).write(result_id, fields)
        return None
    history = queue.history(result_id) if keeps_records else []
    fields |= error_fields(history)
    fields[f"error:{attempt}"] = error_json(_task_error(queue, message, error))
    fields["finished_at"] = timezone.now().isoformat()
    record = backend.records(queue).write(result_id, fields)
    return build_result(task, result_id, call, record, history)


def _backend_for(call: TaskCall, queue: str) -> DelayQueueBackend:
    try:
        backend = task_backends[call.backend]
    except Exception:  # the framework raises InvalidTaskBackend for unknown aliases
        raise UnknownTask(f"no TASKS backend named {call.backend!r}") from None
    if not isinstance(backend, DelayQueueBackend):
        raise UnknownTask(f"TASKS[{call.backend!r}] is not a DelayQueueBackend")
    if queue != call.queue_name or queue not in backend.queues:
        raise UnknownTask(
            f"the message came from queue {queue!r}, which does not carry the tasks of "
            f"TASKS[{call.backend!r}] for queue {call.queue_name!r}"
        )
    return backend


def _task_error(queue: Any, message: Message | None, error: BaseException) -> TaskError:
    """The error as the result keeps it: as the queue's HISTORY_REDACT leaves it, when the
    message is at hand (as its attempt record keeps it)."""
    if message is not None and queue.config.history_redact is not None:
        note = queue.attempt_note(message, error)
        return TaskError(exception_class_path=note.error_class, traceback=note.traceback)
    kind = type(error)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(error)),
    )
