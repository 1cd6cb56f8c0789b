"""``manage.py delayqueue_check [QUEUE ...]``: check each queue's Redis state against the
engine's rules (every message in exactly one state, nothing orphaned), for operators and
scripts after an incident; a sharded queue shard by shard, each problem under its shard."""

from typing import Any

from django.core.management.base import CommandError, CommandParser
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.invariants import InvariantReport, check_shard, combined
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.exceptions import (
    QueueConfigurationError,
    UnknownQueue,
    UnsupportedRedisVersion,
)
from delayqueue_django.management import redis_checks
from delayqueue_django.management.commands.run_delayqueue import positive_int
from delayqueue_django.management.own_process import OwnProcessCommand

# Exit codes (2 is Django's own for a usage error; 1 as in delayqueue_stats).
UNREACHABLE, INCONSISTENT = 1, 3


class Command(OwnProcessCommand):
    help = (
        "Checks each queue's state in Redis: every message in exactly one state, no orphaned "
        "payload or meta record, exhaustions owed only for dead letters, ids and payloads "
        "that are UTF-8 text. Reads each queue whole, in one atomic step (a sharded queue, "
        "one per shard): on a very large queue Redis pauses for the read; then reads every "
        "payload a page at a time. Exit "
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
        if not chosen:
            # Checking nothing is no "no problem" for a script that relies on exit 0.
            raise CommandError("DELAYQUEUES defines no queue: nothing to check.")
        unreachable, inconsistent = [], []
        try:
            advice = redis_checks.advise(chosen)
        except UnsupportedRedisVersion as error:
            raise CommandError(str(error)) from None
        for queue in chosen:
            report, whole = self._check(queue, show)
            if not whole:
                unreachable.append(queue.name)
            if report is None:
                continue
            for said in advice:
                if said.queue == queue.name:
                    self.stdout.write(f"  {said.label}: {said.message}")
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

    def _check(self, queue: Queue, show: int) -> tuple[InvariantReport | None, bool]:
        """Check and print a queue: its report (None if none of it could be read), and
        whether all of it could."""
        if len(parts(queue.store)) > 1:
            return self._check_shards(queue, show)
        try:
            report = queue.check_invariants()
        except RedisError as error:
            self.stdout.write(f"{queue.name}: Redis unavailable: {error}")
            return None, False
        self._print(report, show)
        return report, True

    def _check_shards(self, queue: Queue, show: int) -> tuple[InvariantReport | None, bool]:
        """A sharded queue, shard by shard: a line for the queue, then one for each shard
        with its problems under it (at most ``show`` in all)."""
        reports: dict[str, InvariantReport] = {}
        errors: dict[str, str] = {}
        stores = parts(queue.store)
        for name, store in stores.items():
            try:
                reports[name] = check_shard(name, store)
            except RedisError as error:
                errors[name] = str(error)
        if not reports:
            self.stdout.write(f"{queue.name}: Redis unavailable: {next(iter(errors.values()))}")
            return None, False
        report = combined(list(reports.values()))
        missing = ""
        if errors:
            missing = (
                f"Redis unavailable for shard(s) {', '.join(errors)}; "
                f"the other {len(reports)} shard(s): "
            )
        self.stdout.write(f"{queue.name}: {missing}{_summary(report)}")
        left = show
        for name in stores:
            if name in errors:
                self.stdout.write(f"  shard {name}: Redis unavailable: {errors[name]}")
                continue
            shard = reports[name]
            self.stdout.write(f"  shard {name}: {_summary(shard)}")
            for problem in shard.problems[:left]:
                self.stdout.write(f"    {problem}")
            left -= min(left, len(shard.problems))
        if len(report.problems) > show:
            self.stdout.write(f"  ... and {len(report.problems) - show} more")
        self._notes(report, show)
        return report, not errors

    def _print(self, report: InvariantReport, show: int) -> None:
        self.stdout.write(f"{report.queue}: {_summary(report)}")
        for problem in report.problems[:show]:
            self.stdout.write(f"  {problem}")
        if len(report.problems) > show:
            self.stdout.write(f"  ... and {len(report.problems) - show} more")
        self._notes(report, show)

    def _notes(self, report: InvariantReport, show: int) -> None:
        if report.damaged:
            self.stdout.write(
                f"  note: {report.damaged} dead letter(s) lack a readable payload or meta "
                "record (damage set aside; requeue cannot revive them, delete them)"
            )
        for name in report.quarantined[:show]:
            self.stdout.write(f"  note: a key of the wrong type was renamed aside to {name}")
        if len(report.quarantined) > show:
            self.stdout.write(f"  ... and {len(report.quarantined) - show} more renamed aside")


def _summary(report: InvariantReport) -> str:
    """``ok; 3 messages (pending 2, ...)``, or ``2 problem(s); ...``."""
    counts = ", ".join(f"{state} {count}" for state, count in report.counts.items())
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    return f"{verdict}; {report.messages} messages ({counts})"
