"""The Tasks wing as the core sees it (``core.features.TaskMessages``): a queue that a
DelayQueueBackend lists runs its messages as tasks, and a schedule may name a task."""

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from delayqueue_django.core.message import Message
from delayqueue_django.tasks.call import TaskCall
from delayqueue_django.tasks.claims import (
    DEFAULT_TASK_QUEUES,
    delayqueue_backends,
    task_queue_names,
)


class TaskMessages:
    def handler_for(self, queue: str) -> Callable[[Message], Any] | None:
        if queue not in task_queue_names():
            return None
        # The runner needs the task framework, which only a project with a task backend
        # has: imported once a queue is known to carry tasks.
        from delayqueue_django.tasks.runner import run_task

        return run_task

    def call_payload(
        self,
        task: str,
        *,
        queue: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        enqueued_at: datetime,
        run_after: datetime,
    ) -> Any | None:
        """A call of ``task`` due at ``run_after``, on the first DelayQueueBackend (by alias)
        whose QUEUES list ``queue``."""
        aliases = [
            alias
            for alias, params in sorted(delayqueue_backends().items())
            if queue in params.get("QUEUES", DEFAULT_TASK_QUEUES)
        ]
        if not aliases:
            return None
        call = TaskCall(
            task_path=task,
            backend=aliases[0],
            queue_name=queue,
            args=list(args),
            kwargs=dict(kwargs),
            enqueued_at=enqueued_at.isoformat(),
            run_after=run_after.isoformat(),
        )
        return call.to_payload()
