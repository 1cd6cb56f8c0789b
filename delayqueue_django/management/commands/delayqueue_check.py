"""``manage.py delayqueue_check [QUEUE ...]``: check each queue's Redis state against the
engine's rules (every message in exactly one state, nothing orphaned), for operators and
scripts after an incident."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from delayqueue_django import redis_checks, registry
from delayqueue_django.engine.invariants import InvariantReport
from delayqueue_django.exceptions import (
    QueueConfigurationError,
    UnknownQueue,
    UnsupportedRedisVersion,
)
from delayqueue_django.management.commands.run_delayqueue import positive_int

# Exit codes (2 is Django's own for a usage error; 1 as in delayqueue_stats).
UNREACHABLE, INCONSISTENT = 1, 3


class Command(BaseCommand):
    help = (
        "Checks each queue's state in Redis: every message in exactly one state, no orphaned "
        "payload or meta record, exhaustions owed only for dead letters, ids and payloads "
        "that are UTF-8 text. Reads each queue whole, in one atomic step: on a very large "
        "queue Redis pauses for the read; then reads every payload a page at a time. Exit "
        f"codes: {UNREACHABLE} a queue's Redis cannot be reached, {INCONSISTENT} a problem "
        "was found."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues (default: all).")
        parser.add_argument(
            "--show",
            type=positive_int,
            default=20,
            metavar="N",
            help="List at most N problems per queue (default: 20).",
        )

    def handle(self, *args: Any, queues: list[str], show: int, **options: Any) -> None:
        try:
            names = list(dict.fromkeys(queues)) or registry.queue_names()
            chosen = [registry.get_queue(name) for name in names]
        except (QueueConfigurationError, UnknownQueue) as error:
            raise CommandError(str(error)) from None
        unreachable, inconsistent = [], []
        try:
            advice = redis_checks.advise(chosen)
        except UnsupportedRedisVersion as error:
            raise CommandError(str(error)) from None
        for queue in chosen:
            try:
                report = queue.check_invariants()
            except RedisError as error:
                self.stdout.write(f"{queue.name}: Redis unavailable: {error}")
                unreachable.append(queue.name)
                continue
            self._print(report, show)
            for said in advice:
                if said.queue == queue.name:
                    self.stdout.write(f"  {said.label}: {said.text}")
            if not report.ok:
                inconsistent.append(queue.name)
        if unreachable:
            raise CommandError(
                f"Redis unavailable for {', '.join(unreachable)}", returncode=UNREACHABLE
            )
        if inconsistent:
            raise CommandError(
                f"problems found in {', '.join(inconsistent)}", returncode=INCONSISTENT
            )

    def _print(self, report: InvariantReport, show: int) -> None:
        counts = ", ".join(f"{state} {count}" for state, count in report.counts.items())
        verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        self.stdout.write(f"{report.queue}: {verdict}; {report.messages} messages ({counts})")
        for problem in report.problems[:show]:
            self.stdout.write(f"  {problem}")
        if len(report.problems) > show:
            self.stdout.write(f"  ... and {len(report.problems) - show} more")
        if report.damaged:
            self.stdout.write(
                f"  note: {report.damaged} dead letter(s) lack a readable payload or meta "
                "record (damage set aside; requeue cannot revive them, delete them)"
            )
        for name in report.quarantined[:show]:
            self.stdout.write(f"  note: a key of the wrong type was renamed aside to {name}")
        if len(report.quarantined) > show:
            self.stdout.write(f"  ... and {len(report.quarantined) - show} more renamed aside")
