"""``manage.py delayqueue_pause QUEUE [--resume]``: pause a queue on every worker (nothing is
handed out until it is resumed; sends keep arriving), or resume it."""

from typing import Any

from django.core.management.base import CommandError, CommandParser
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.exceptions import QueueConfigurationError, QueueUnavailable, UnknownQueue
from delayqueue_django.management.own_process import OwnProcessCommand


class Command(OwnProcessCommand):
    help = (
        "Pauses a queue: no worker hands out its messages (those in flight finish) until "
        "it is resumed with --resume, which wakes the workers at once. Kept in Redis."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue to pause or resume.")
        parser.add_argument(
            "--resume", action="store_true", help="Resume the queue instead of pausing it."
        )

    def handle(self, *args: Any, queue: str, resume: bool, **options: Any) -> None:
        try:
            found = registry.get_queue(queue)
        except (UnknownQueue, QueueConfigurationError) as error:
            raise CommandError(str(error)) from None
        # (A memory queue's state is the sending process's: another one cannot pause it.)
        self.refuse_memory_queues([found], instead="Call Queue.pause() in that process.")
        try:
            if resume:
                found.resume()
            else:
                found.pause()
        except (QueueUnavailable, RedisError) as error:
            raise CommandError(f"queue {queue!r}: Redis cannot be reached: {error}") from None
        self.stdout.write(f"{queue}: {'resumed' if resume else 'paused'}")
