"""Commands that cannot serve a memory queue from a process of their own: its messages live in
the memory of the process that sends them."""

from collections.abc import Sequence

from django.core.management.base import BaseCommand, CommandError

from delayqueue_django.queue import Queue


class OwnProcessCommand(BaseCommand):
    """A command that knows whether it runs as a process of its own (``manage.py``), rather
    than by ``call_command`` inside a running one."""

    own_process = False

    def run_from_argv(self, argv: list[str]) -> None:
        self.own_process = True
        super().run_from_argv(argv)

    def refuse_memory_queues(self, queues: Sequence[Queue], *, instead: str) -> None:
        """In a process of its own, say that a memory queue cannot be seen, and what to do
        ``instead``, rather than show or wait for messages that never come."""
        if not self.own_process:
            return
        for queue in queues:
            if queue.config.memory_name is not None:
                raise CommandError(
                    f"queue {queue.name!r} keeps its messages in the memory of the process "
                    f"that sends them ({queue.config.url}); a process of its own would never "
                    f"see them. {instead}"
                )
