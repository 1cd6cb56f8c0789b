"""The Tasks wing as the core sees it (``core.features.TaskMessages``): a queue that a
DelayQueueBackend lists runs its messages as tasks, and a schedule may name a task."""

from collections.abc import Callable
from typing import Any

from delayqueue_django.core.features import TaskCallSpec
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
        from delayqueue_django.tasks.runner import task_handler

        return task_handler

    def processed_before(self, message: Message) -> None:
        if message.queue not in task_queue_names():
            return
        from delayqueue_django.tasks.runner import finish_processed_task

        finish_processed_task(message)

    def call_payload(self, call: TaskCallSpec) -> Any | None:
        """A call due at ``call.run_after``, on the first DelayQueueBackend (by alias)
        whose QUEUES list its queue."""
        aliases = [
            alias
            for alias, params in sorted(delayqueue_backends().items())
            if call.queue in params.get("QUEUES", DEFAULT_TASK_QUEUES)
        ]
        if not aliases:
            return None
        return TaskCall(
            task_path=call.task,
            backend=aliases[0],
            queue_name=call.queue,
            args=list(call.args),
            kwargs=dict(call.kwargs),
            enqueued_at=call.enqueued_at.isoformat(),
            run_after=call.run_after.isoformat(),
        ).to_payload()
