"""``manage.py delayqueue_pause QUEUE [--resume]``: pause a queue on every worker (nothing is
handed out until it is resumed; sends keep arriving), or resume it."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from delayqueue_django.core import registry
from delayqueue_django.exceptions import QueueConfigurationError, QueueUnavailable, UnknownQueue


class Command(BaseCommand):
    help = (
        "Pauses a queue: no worker hands out its messages (those in flight finish) until "
        "it is resumed with --resume, which wakes the workers at once. Kept in Redis."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue to pause or resume.")
        parser.add_argument(
            "--resume", action="store_true", help="Resume the queue instead of pausing it."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["queue"]
        try:
            queue = registry.get_queue(name)
            if options["resume"]:
                queue.resume()
            else:
                queue.pause()
        except (UnknownQueue, QueueConfigurationError, QueueUnavailable) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(f"{name}: {'resumed' if options['resume'] else 'paused'}")
