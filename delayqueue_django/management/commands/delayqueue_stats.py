"""``manage.py delayqueue_stats [QUEUE ...]``: counts, lag and live workers, for terminals,
scripts and health probes."""

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser

from delayqueue_django.core import registry
from delayqueue_django.exceptions import (
    QueueConfigurationError,
    UnknownQueue,
    UnsupportedRedisVersion,
)
from delayqueue_django.management import redis_checks
from delayqueue_django.management.commands.run_delayqueue import (
    non_negative_seconds,
    positive_seconds,
)
from delayqueue_django.management.own_process import OwnProcessCommand
from delayqueue_django.monitoring.reports import (
    describe_running,
    describe_worker,
    queue_report,
    running_handlers,
    worker_processes,
)

# Exit codes, for health probes (2 is Django's own for a usage error).
UNREACHABLE, LAGGING, NO_WORKER = 1, 3, 4
COUNTS = ("pending", "ready", "unack", "retry", "garbage", "due")


# The signals that stop --watch: Ctrl-C at a terminal, SIGTERM from a supervisor or `kill`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stopped_by_signal(
    stop: threading.Event, signals: tuple[signal.Signals, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """In the main thread, a first SIGINT (Ctrl-C) or SIGTERM sets ``stop``: the report
    being made is finished, and the loop ends, whatever code the signal fell in (a
    KeyboardInterrupt there could be caught on its way). A second one interrupts at once
    (a KeyboardInterrupt, for either). Elsewhere (a ``call_command`` from another thread)
    the signals are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def first(signum: int, frame: Any) -> None:
        stop.set()
        for each in signals:
            signal.signal(each, signal.default_int_handler)

    for signum in signals:
        signal.signal(signum, first)
    try:
        yield
    finally:
        # (None: a handler not set from Python, which cannot be put back; the default then.)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


class Command(OwnProcessCommand):
    help = (
        "Shows each queue's counts, how long its oldest due message has waited, and its live "
        f"workers. Exit codes: {UNREACHABLE} a queue's Redis (or that of one of its shards, "
        f"left out of its figures) cannot be reached, {LAGGING} a "
        f"queue lags more than --max-lag, {NO_WORKER} --require-workers and a queue has none."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues (default: all).")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--watch",
            type=positive_seconds,
            metavar="N",
            help="Print again every N seconds until stopped (Ctrl-C or SIGTERM: exit 0).",
        )
        parser.add_argument(
            "--max-lag",
            type=non_negative_seconds,
            metavar="SECONDS",
            help=f"Exit {LAGGING} if a due message has waited longer than this.",
        )
        parser.add_argument(
            "--no-shards",
            action="store_true",
            help="Leave out the rows of a sharded queue's shards (and their 'shards' in --json).",
        )
        parser.add_argument(
            "--require-workers",
            action="store_true",
            help=f"Exit {NO_WORKER} if a queue has no live worker.",
        )

    def handle(
        self,
        *args: Any,
        queues: list[str],
        json: bool,
        watch: float | None,
        max_lag: float | None,
        require_workers: bool,
        no_shards: bool,
        **options: Any,
    ) -> None:
        if watch is not None and (max_lag is not None or require_workers):
            # A watch ends only when interrupted, with 0: the verdict would never be given.
            raise CommandError(
                "--watch cannot be combined with --max-lag or --require-workers: it prints "
                "until interrupted and never gives a verdict; run the probe without --watch."
            )
        try:
            names = list(dict.fromkeys(queues)) or registry.queue_names()
            chosen = [registry.get_queue(name) for name in names]
        except (QueueConfigurationError, UnknownQueue) as error:
            raise CommandError(str(error)) from None
        if not chosen:
            # A probe that looks at nothing must not pass as healthy.
            raise CommandError("DELAYQUEUES defines no queue: nothing to show.")
        self.refuse_memory_queues(
            chosen,
            instead="Look at them from that process (the admin, or "
            "call_command('delayqueue_stats')), or give the queue a Redis URL.",
        )
        # On stderr: --json output stays parseable.
        try:
            advice = redis_checks.advise(chosen)
        except UnsupportedRedisVersion as error:
            raise CommandError(str(error)) from None
        for said in advice:
            self.stderr.write(str(said))
        if watch is None:
            reports = {queue.name: queue_report(queue) for queue in chosen}
            self._print(reports, as_json=json, shards=not no_shards)
            self._verdict(reports, max_lag, require_workers)
            return
        stop = threading.Event()
        with _stopped_by_signal(stop, self.stop_signals()):
            try:
                while not stop.is_set():
                    self._print(
                        {queue.name: queue_report(queue) for queue in chosen},
                        as_json=json,
                        shards=not no_shards,
                    )
                    self.stdout.flush()
                    stop.wait(watch)
            except KeyboardInterrupt:
                return

    def _print(self, reports: dict[str, dict[str, Any]], *, as_json: bool, shards: bool) -> None:
        if as_json:
            if not shards:
                reports = {
                    name: {key: value for key, value in data.items() if key != "shards"}
                    for name, data in reports.items()
                }
            self.stdout.write(json.dumps({"queues": reports}, sort_keys=True))
            return
        header = f"{'queue':<20}" + "".join(f"{name:>9}" for name in COUNTS)
        self.stdout.write(f"{header}{'lag':>10}  {'next due (UTC)':<20} workers")
        for name, data in reports.items():
            self._print_outbox(name, data)
            if "pending" not in data:  # no figures: no shard could be read
                self.stdout.write(f"{name:<20} Redis unavailable: {data['error']}")
                if shards:
                    self._print_shards(data)
                continue
            if data["workers"] is None:
                workers = "unknown (shard 0 is down)"
            else:
                workers = ", ".join(describe_worker(w) for w in data["workers"]) or "none"
            self.stdout.write(f"{name:<20}{_figures(data)} {workers}")
            if data.get("paused"):
                self.stdout.write(
                    f"{name:<20} paused: no worker hands out its messages "
                    f"(resume: manage.py delayqueue_pause {name} --resume)"
                )
            if data["shards_down"]:
                self.stdout.write(
                    f"{name:<20} warning: the figures above leave out "
                    f"{data['shards_down']} shard(s) down: {data['error']}"
                )
            # Each running handler on a line of its own, so that a hung one stands out.
            for worker in data["workers"] or []:
                for handler in running_handlers(worker):
                    self.stdout.write(
                        f"  {worker.get('host')}:{worker.get('pid')} running "
                        f"{describe_running(handler)}"
                    )
            if shards:
                self._print_shards(data)

    def _print_shards(self, data: dict[str, Any]) -> None:
        """A sharded queue's shards, a row each under the queue's: its figures and where it
        is (its hash tag; on Redis Cluster its slot and master) instead of workers."""
        for shard_name, shard in data.get("shards", {}).items():
            label = f"  shard {shard_name}"
            if not shard["ok"]:
                self.stdout.write(f"{label:<20} unreachable: {shard['error']}")
                continue
            where = shard["tag"]
            if shard["slot"] is not None:
                where += f" slot {shard['slot']} on {shard['server'] or '?'}"
            self.stdout.write(f"{label:<20}{_figures(shard)} {where}")

    def _print_outbox(self, name: str, data: dict[str, Any]) -> None:
        """A line for a queue whose messages wait in the outbox (or whose outbox database
        cannot be read); none while the outbox is empty."""
        if data.get("outbox_error"):
            self.stdout.write(f"{name:<20} outbox unreadable: {data['outbox_error']}")
        elif data.get("outbox"):
            self.stdout.write(
                f"{name:<20} outbox: {data['outbox']} waiting, the oldest for "
                f"{data['outbox_age_ms'] / 1000:.1f} s"
            )

    def _verdict(
        self, reports: dict[str, dict[str, Any]], max_lag: float | None, require_workers: bool
    ) -> None:
        unreachable = [name for name, data in reports.items() if not data["ok"]]
        if unreachable:
            raise CommandError(
                f"Redis unavailable for {', '.join(unreachable)}", returncode=UNREACHABLE
            )
        if max_lag is not None:
            # A message waiting in the outbox (no relay running, Redis away) lags as well.
            lagging = [
                n
                for n, d in reports.items()
                if max(d["lag_ms"], d.get("outbox_age_ms") or 0) > max_lag * 1000
            ]
            if lagging:
                raise CommandError(
                    f"lagging more than {max_lag:g} s: {', '.join(lagging)}", returncode=LAGGING
                )
        if require_workers:
            # A supervisor alone (its worker processes all down) handles nothing.
            idle = [
                name
                for name, data in reports.items()
                if not worker_processes(data["workers"] or [])
            ]
            if idle:
                raise CommandError(f"no live worker for {', '.join(idle)}", returncode=NO_WORKER)


def _figures(stats: dict[str, Any]) -> str:
    """The counts, lag and next due time of a row (a queue's, or a shard's)."""
    counts = "".join(f"{stats[key]:>9}" for key in COUNTS)
    lag = f"{stats['lag_ms'] / 1000:.1f} s"
    next_due = stats["next_due_ms"]
    due = "-"
    if next_due >= 0:
        due = datetime.fromtimestamp(next_due / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{counts}{lag:>10}  {due:<20}"
