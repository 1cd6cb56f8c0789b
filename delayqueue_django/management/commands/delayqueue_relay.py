"""``manage.py delayqueue_relay [QUEUE ...]``: relay outbox rows to Redis, in a process of
its own (``run_delayqueue`` relays its queues' rows itself unless given ``--no-relay``)."""

import signal
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.exceptions import QueueConfigurationError, UnknownQueue
from delayqueue_django.management.commands.run_delayqueue import (
    non_negative_seconds,
    positive_int,
)
from delayqueue_django.management.own_process import OwnProcessCommand
from delayqueue_django.outbox.databases import outbox_databases, outbox_databases_problem
from delayqueue_django.outbox.relay import RELAY_BATCH_SIZE, RELAY_POLL_SECONDS, OutboxRelay


class Command(OwnProcessCommand):
    help = (
        "Relays committed outbox rows (send(..., outbox=True)) to their queues in Redis until "
        "stopped (SIGTERM/SIGINT), or once with --burst."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "queues",
            nargs="*",
            metavar="QUEUE",
            help="Queues whose rows to relay (default: all in DELAYQUEUES).",
        )
        parser.add_argument(
            "--database",
            action="append",
            dest="databases",
            metavar="ALIAS",
            help="A database whose outbox to read; repeat for several "
            "(default: DELAYQUEUE_OUTBOX_DATABASES).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Relay every row committed by now, then exit 0.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=RELAY_BATCH_SIZE,
            help="Rows of each queue taken per database transaction "
            f"(default: {RELAY_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--poll",
            type=non_negative_seconds,
            default=RELAY_POLL_SECONDS,
            help=f"Seconds between looks at the outbox (default: {RELAY_POLL_SECONDS:g}).",
        )

    def handle(
        self,
        *args: Any,
        queues: list[str],
        databases: list[str] | None,
        burst: bool,
        batch_size: int,
        poll: float,
        verbosity: int,
        **options: Any,
    ) -> None:
        try:
            names = list(queues) or registry.queue_names()
            chosen = [registry.get_queue(name) for name in dict.fromkeys(names)]
            if databases is None:
                aliases = outbox_databases()
                problem = outbox_databases_problem(aliases)
                if problem is not None:
                    raise QueueConfigurationError(problem.msg)
            else:
                aliases = databases
                unknown = [alias for alias in aliases if alias not in settings.DATABASES]
                if unknown:
                    # Named as the option it came from, not as the setting it replaces.
                    raise QueueConfigurationError(
                        f"--database: no database {unknown[0]!r} in DATABASES; configured: "
                        f"{', '.join(map(repr, settings.DATABASES)) or 'none'}"
                    )
        except (QueueConfigurationError, UnknownQueue) as error:
            raise CommandError(str(error)) from None
        if not chosen or not aliases:
            raise CommandError("no queue or no database to relay (see DELAYQUEUES and --database)")
        self.refuse_memory_queues(
            chosen,
            instead="Relay in that process (run_delayqueue relays by default), or give the "
            "queue a Redis URL.",
        )
        relay = OutboxRelay(
            chosen, databases=aliases, batch_size=batch_size, poll_seconds=max(poll, 0.01)
        )
        with self.package_log(verbosity):
            self._relay(relay, burst=burst, verbosity=verbosity)

    def _relay(self, relay: OutboxRelay, *, burst: bool, verbosity: int) -> None:
        if burst:
            try:
                taken = relay.drain()
            except (RedisError, DatabaseError) as error:
                # Rolled back: the rows wait for the next run. One line, no traceback; a
                # relay run until stopped retries instead (see OutboxRelay.run).
                raise CommandError(f"outbox relay failed, its rows wait: {error}") from None
            if verbosity >= 1:
                self.stdout.write(
                    f"Relayed {relay.relayed} messages ({relay.repeated} relayed before), "
                    f"{taken} rows."
                )
            return
        if verbosity >= 1:
            self.stdout.write(
                f"delayqueue_django outbox relay: queue {', '.join(map(repr, relay.queues))}, "
                f"database {', '.join(map(repr, relay.databases))}"
            )
            self.stdout.flush()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            relay.stop()

        try:
            previous = {sig: signal.signal(sig, on_signal) for sig in self.stop_signals()}
        except ValueError:  # not the main thread: the caller stops the relay itself
            previous = {}
        try:
            relay.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if verbosity >= 1:
            self.stdout.write(
                f"Relay stopped: {relay.relayed} messages relayed "
                f"({relay.repeated} relayed before)."
            )
