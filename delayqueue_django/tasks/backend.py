"""``DelayQueueBackend``: Django's task framework on delayqueue_django queues.

A task call becomes one message on the DELAYQUEUES queue named by the task's ``queue_name``;
``run_delayqueue`` runs it (see ``runner``) under that queue's retry rules, and records the
outcome in Redis (see ``results``), where any process can read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import timedelta
from functools import partial
from typing import Any, ClassVar, ParamSpec, TypeVar, cast

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import transaction
from django.utils import timezone

from delayqueue_django.core import conf, features, handlers
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.registry import get_queue
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.tasks.call import TaskCall
from delayqueue_django.tasks.claims import delayqueue_backends
from delayqueue_django.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from delayqueue_django.tasks.locate import NOT_A_TASK, declared_task, enqueued_task
from delayqueue_django.tasks.results import ResultRecords, build_result

DEFAULT_RESULT_TTL = timedelta(days=7)

P = ParamSpec("P")
R = TypeVar("R")


class DelayQueueBackend(BaseTaskBackend):
    """A Django Tasks backend whose tasks are messages on the DELAYQUEUES queues it lists in
    ``QUEUES``; ``run_delayqueue`` runs them, and their results live beside the queue."""

    supports_defer = True
    # Coroutine tasks are awaited on the worker's event loop (in a handler thread through
    # async_to_sync on an EXACTLY_ONCE queue, whose transaction cannot hold an await).
    supports_async_task = True
    supports_get_result = True
    # A delay queue orders by due time only; priorities would be a promise it cannot keep.
    supports_priority = False
    # How tasks.claims tells this class and its subclasses from other backends.
    carries_delayqueues: ClassVar[bool] = True

    # Enqueueing

    def validate_task(self, task: Task[P, R]) -> None:
        super().validate_task(task)
        # A task declared for a backend of another kind is not ours to run, whoever names it:
        # refused here when using(backend=...) moves it onto this backend, and so (the worker
        # rebuilds each message's task with using()) when a message names it.
        declared = declared_task(task.module_path)
        if (
            declared is not None
            and declared.backend != self.alias
            and declared.backend not in delayqueue_backends()
        ):
            raise InvalidTask(
                f"{task.module_path} is declared for TASKS[{declared.backend!r}], which is not "
                "a DelayQueueBackend; a DelayQueueBackend runs only tasks declared for one"
            )

    def enqueue(
        self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, R]:
        queue = self._queue_for(task)
        call = self._call(task, args, kwargs)
        message_id = queue.send(call.to_payload(), at=task.run_after)
        return self._enqueued(queue, task, message_id, call)

    async def aenqueue(
        self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, R]:
        queue = self._queue_for(task)
        call = self._call(task, args, kwargs)
        message_id = await queue.asend(call.to_payload(), at=task.run_after)
        if self._announced_on_commit(queue):
            # The transaction, and the commit hook asend left the message in, belong to the
            # sync thread: the announcement waits for that commit too, so it is set there.
            enqueued = sync_to_async(self._enqueued, thread_sensitive=True)
            return await enqueued(queue, task, message_id, call)
        result = build_result(task, message_id, call, {})
        # Sync receivers in a thread, as for the framework's own backends (whose aenqueue
        # is enqueue in a thread): one may use the ORM.
        await task_enqueued.asend(sender=type(self), task_result=result)
        return result

    def _queue_for(self, task: Task[P, R]) -> Queue:
        self.validate_task(task)
        if not self.queues:
            # The framework takes empty QUEUES for "any queue"; here that would send the
            # task to whatever queue it names, one whose handler is not the task runner too.
            raise InvalidTask(
                f"TASKS[{self.alias!r}]['QUEUES'] is empty: this backend sends tasks to no "
                "queue (see check E101)"
            )
        return get_queue(task.queue_name)

    def _call(self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]) -> TaskCall:
        run_after = task.run_after
        return TaskCall(
            task_path=task.module_path,
            backend=self.alias,
            queue_name=task.queue_name,
            # What JSON can carry, as the framework's own TaskResult normalizes it.
            args=cast(list[Any], normalize_json(list(args))),
            kwargs=cast(dict[str, Any], normalize_json(dict(kwargs))),
            enqueued_at=timezone.now().isoformat(),
            run_after=None if run_after is None else run_after.isoformat(),
        )

    def _enqueued(
        self, queue: Queue, task: Task[P, R], message_id: str, call: TaskCall
    ) -> TaskResult[P, R]:
        result = build_result(task, message_id, call, {})
        announce = partial(task_enqueued.send, sender=type(self), task_result=result)
        if self._announced_on_commit(queue):
            # The message exists (in Redis, or in the outbox for the relay to bring there)
            # when the transaction commits: say so only then.
            transaction.on_commit(announce)
        else:
            announce()
        return result

    @staticmethod
    def _announced_on_commit(queue: Queue) -> bool:
        return queue.config.send_on_commit or queue.config.outbox

    # Results

    def records(self, queue: Queue) -> ResultRecords:
        return ResultRecords(queue, self.result_ttl_seconds())

    def result_ttl_seconds(self) -> int | None:
        ttl = self.options.get("RESULT_TTL", DEFAULT_RESULT_TTL)
        problem = _ttl_problem(ttl)
        if problem:
            raise QueueConfigurationError(f"TASKS[{self.alias!r}]: {problem}")
        if ttl is None:
            return None
        seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
        return max(round(seconds), 1)

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        if not isinstance(result_id, str) or not result_id:
            raise TaskResultDoesNotExist(result_id)
        for queue in self._queues():
            result = self._result_in(queue, result_id)
            if result is not None:
                return result
        raise TaskResultDoesNotExist(result_id)

    def _result_in(self, queue: Queue, result_id: str) -> TaskResult[..., Any] | None:
        record = self.records(queue).read(result_id)
        status = None
        if record:
            payload = json.loads(record["call"])
        else:
            # Not run yet: the message itself is the whole story (in Redis, or still in the
            # outbox, not relayed yet: READY all the same).
            stored = queue.peek(result_id)
            if stored is not None and stored.payload is not None:
                payload = json.loads(stored.payload)
                status = TaskResultStatus.FAILED if stored.state == "garbage" else None
            elif queue.config.outbox and (
                waiting := features.outbox().payload_of(queue.name, result_id)
            ):
                payload = json.loads(waiting)
            else:
                return None
        try:
            call = TaskCall.from_payload(payload)
            if call.backend != self.alias or call.queue_name != queue.name:
                return None  # not a task of this backend on this queue: not its result
            task = enqueued_task(call)
        except NOT_A_TASK:
            return None  # a message of this queue, but not a task this process may run
        if status is not None:
            record = {"status": status}
        history = queue.history(result_id) if queue.config.history_attempts else []
        return build_result(task, result_id, call, record, history)

    def _queues(self) -> Iterator[Queue]:
        for name in sorted(self.queues):
            if name in conf.queue_configs():
                yield get_queue(name)

    # Checks

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        if not self.queues:
            errors.append(
                checks.Error(
                    f"{where}['QUEUES'] is empty; list the DELAYQUEUES queues this backend "
                    "sends tasks to.",
                    id="delayqueue_django.E101",
                )
            )
        # The queues DELAYQUEUES names, valid or not: what is wrong with a queue's options
        # is DELAYQUEUES' own checks' to report, once, and not a queue missing here.
        raw = conf.raw_setting()
        named = set(raw) if isinstance(raw, Mapping) else self.queues
        configured, _ = conf.parse(raw)
        for name in sorted(self.queues - named):
            errors.append(
                checks.Error(
                    f"{where}['QUEUES'] names {name!r}, which is not in DELAYQUEUES.",
                    hint=f"Add DELAYQUEUES[{name!r}] or remove it from QUEUES.",
                    id="delayqueue_django.E102",
                )
            )
        for name in sorted(self.queues & set(configured)):
            config = configured[name]
            if config.handler is not None or handlers.is_registered(name):
                errors.append(
                    checks.Error(
                        f"DELAYQUEUES[{name!r}] carries tasks of {where} but also has a "
                        "handler of its own; a task queue's messages are run as tasks.",
                        hint="Give the tasks a queue of their own.",
                        id="delayqueue_django.E103",
                    )
                )
        problem = _ttl_problem(self.options.get("RESULT_TTL", DEFAULT_RESULT_TTL))
        if problem:
            errors.append(checks.Error(f"{where}: {problem}", id="delayqueue_django.E104"))
        return errors


def _ttl_problem(ttl: Any) -> str | None:
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, int | float) and not isinstance(ttl, bool):
        seconds = ttl
    else:
        return f"OPTIONS['RESULT_TTL'] must be seconds, a timedelta or None, not {ttl!r}"
    if not seconds >= 1:
        return f"OPTIONS['RESULT_TTL'] must be at least one second, not {ttl!r}"
    return None
