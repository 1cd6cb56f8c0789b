"""``manage.py run_delayqueue [QUEUE ...]``: deliver due messages to their handlers."""

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.management.base import CommandError, CommandParser
from django.utils import autoreload

from delayqueue_django.core import registry
from delayqueue_django.core.handlers import Handler, HandlerNotFound, is_async, resolve
from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import (
    QueueConfigurationError,
    UnknownQueue,
    UnsupportedRedisVersion,
)
from delayqueue_django.management import redis_checks
from delayqueue_django.management.banner_limits import limits_lines
from delayqueue_django.management.own_process import OwnProcessCommand
from delayqueue_django.management.process_signals import (
    child_signals,
    stop_gracefully,
    supervisor_signals,
)
from delayqueue_django.outbox.relay import RELAY_POLL_SECONDS
from delayqueue_django.worker import Worker, memory
from delayqueue_django.worker.supervisor import ChildCannotStart, Supervisor
from delayqueue_django.worker.supervisor.link import MessageReports, SupervisorLink
from delayqueue_django.worker.worker import BURST_OUTAGE_SECONDS

# The exit status of a --burst run that gave up on a Redis it could not reach (1 is an
# error at start or a second signal, 2 a usage error): a cron job or CI step can tell it.
GAVE_UP = 3


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def process_count(text: str) -> int:
    """``--processes``: a whole number, or ``auto`` for the host's usable cores."""
    return usable_cores() if text == "auto" else positive_int(text)


def megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MB") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of MB > 0, not {text}")
    return value


def non_negative_seconds(text: str) -> float:
    return _seconds(text, zero_ok=True)


def positive_seconds(text: str) -> float:
    """Seconds for an interval, where 0 would read as "never" but would mean "always"."""
    return _seconds(text, zero_ok=False)


def _seconds(text: str, *, zero_ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    in_range = value >= 0 if zero_ok else value > 0
    if not in_range or value == float("inf"):
        bound = ">= 0" if zero_ok else "> 0"
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds {bound}, not {text}")
    return value


def describe_connection(queue: Queue) -> str:
    config = queue.config
    if config.redis_alias is not None:
        return f"cache {config.redis_alias!r} at {queue.address}"
    if config.memory_name is not None:
        return f"{config.url} (in this process)"
    parts = urlsplit(config.url or "")
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host  # credentials left out
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Command(OwnProcessCommand):
    help = (
        "Runs a worker delivering delay-queue messages to their handlers, until stopped "
        "(SIGTERM/SIGINT: finish running handlers, then exit; a second signal exits at once)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "queues",
            nargs="*",
            metavar="QUEUE",
            help="Queues to consume (default: all in DELAYQUEUES).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Handle everything due now (retries falling due meanwhile included), then exit 0.",
        )
        parser.add_argument(
            "--give-up-after",
            type=non_negative_seconds,
            default=None,
            help="With --burst: stop and exit 3 once a queue's Redis has been unreachable this "
            f"many seconds (default: {BURST_OUTAGE_SECONDS:g}).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help="Handler threads in this process, for sync handlers (default: 1).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=positive_int,
            default=100,
            help="Coroutines in flight at once on this process's event loop, for async def "
            "handlers (default: 100).",
        )
        parser.add_argument(
            "--processes",
            type=process_count,
            default=None,
            metavar="N|auto",
            help="Run N worker processes, each with --concurrency threads, under a supervisor "
            "that replaces those that die (auto: one per usable core). Without it: this "
            "process is the worker.",
        )
        parser.add_argument(
            "--max-memory",
            type=megabytes,
            default=None,
            metavar="MB",
            help="With --processes: replace a worker process once its resident memory passes "
            "this many MB (its running handlers finish first).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="The most messages fetched in one round trip "
            "(default: each queue's FETCH_BATCH_SIZE).",
        )
        parser.add_argument(
            "--max-messages",
            type=positive_int,
            default=None,
            help="Exit gracefully after handling this many messages (default: no limit).",
        )
        parser.add_argument(
            "--grace",
            type=non_negative_seconds,
            default=30.0,
            help="Seconds running handlers get to finish after a stop request (default: 30).",
        )
        parser.add_argument(
            "--jitter",
            type=non_negative_seconds,
            default=0.0,
            help="Wait a random 0..N seconds before starting, to spread out restarts (default: 0).",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Restart the worker when a module it loaded changes, as runserver does "
            "(for development only).",
        )
        parser.add_argument(
            "--heartbeat",
            type=positive_seconds,
            default=10.0,
            help="Seconds between heartbeats published for the admin (default: 10).",
        )
        parser.add_argument(
            "--no-relay",
            action="store_false",
            dest="relay",
            help="Do not relay these queues' outbox rows to Redis in this process (run "
            "delayqueue_relay instead).",
        )
        parser.add_argument(
            "--relay-poll",
            type=non_negative_seconds,
            default=RELAY_POLL_SECONDS,
            help="Seconds between looks at the outbox for rows other processes committed "
            f"(default: {RELAY_POLL_SECONDS:g}).",
        )

    def execute(self, *args: Any, **options: Any) -> str | None:
        if options.get("reload"):
            # As runserver does: the checks run in the restarted process, at each start, so
            # that an error they find waits for a fix instead of ending the command.
            options["checks_at_each_start"] = not options.get("skip_checks", True)
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(
        self,
        *args: Any,
        queues: list[str],
        burst: bool,
        concurrency: int,
        batch_size: int | None,
        max_messages: int | None,
        async_concurrency: int = 100,
        grace: float,
        jitter: float,
        heartbeat: float,
        verbosity: int,
        reload: bool = False,
        checks_at_each_start: bool = False,
        relay: bool = True,
        relay_poll: float = RELAY_POLL_SECONDS,
        give_up_after: float | None = None,
        processes: int | None = None,
        max_memory: float | None = None,
        **options: Any,
    ) -> None:
        link = SupervisorLink.from_environment()
        if link is not None:
            # A worker process of a supervisor: --processes, --max-memory and --reload are
            # the supervisor's to act on.
            processes = max_memory = None
            reload = False
        if max_memory is not None and processes is None:
            raise CommandError("--max-memory is for --processes: the supervisor measures it.")
        if processes is not None and not self.own_process:
            raise CommandError(
                "--processes starts processes of its own: run it with manage.py, not call_command."
            )
        if give_up_after is not None and not burst:
            raise CommandError(
                "--give-up-after is for --burst: a worker run until stopped waits for Redis "
                "however long it is away."
            )
        start = partial(
            self._worker_for,
            queues,
            concurrency=concurrency,
            async_concurrency=async_concurrency,
            batch_size=batch_size,
            burst=burst,
            max_messages=max_messages,
            grace=grace,
            jitter=jitter,
            heartbeat_interval=max(heartbeat, 0.1),
            relay=relay,
            relay_poll=max(relay_poll, 0.01),
            give_up_after=BURST_OUTAGE_SECONDS if give_up_after is None else give_up_after,
            link=link,
        )
        if reload and (burst or max_messages is not None):
            raise CommandError(
                "--reload restarts a worker that runs until stopped; it cannot be combined "
                "with --burst or --max-messages."
            )
        if processes is not None:
            supervise = partial(
                self._supervise,
                queues,
                processes=processes,
                concurrency=concurrency,
                grace=grace,
                burst=burst,
                max_memory=max_memory,
                heartbeat=max(heartbeat, 0.1),
                verbosity=verbosity,
                checks=checks_at_each_start,
            )
            if reload:
                self._say_reloading()
                autoreload.run_with_reloader(self._supervise_until_reload, supervise)
            else:
                supervise()
            return
        if not reload:
            self._run(start(), verbosity, link)
            return
        self._say_reloading()
        # This process watches; a copy of it, restarted after each change, runs the worker.
        autoreload.run_with_reloader(self._run_until_reload, start, verbosity, checks_at_each_start)

    def _say_reloading(self) -> None:
        if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) != "true":
            self.stdout.write(
                "Restarting the worker whenever a module it loaded changes "
                "(--reload: for development only)."
            )
            self.stdout.flush()

    def _handlers_for(self, queues: list[str]) -> list[tuple[Queue, Handler]]:
        """The chosen queues (all by default) and their handlers, imported: a CommandError
        says what is wrong with them."""
        try:
            names = list(queues) or registry.queue_names()
            if not names:
                raise CommandError("DELAYQUEUES defines no queue: nothing to consume.")
            chosen = [registry.get_queue(name) for name in dict.fromkeys(names)]
            handlers = [(queue, resolve(queue.config)) for queue in chosen]
        except (QueueConfigurationError, UnknownQueue, HandlerNotFound) as error:
            raise CommandError(str(error)) from error
        self.refuse_memory_queues(
            chosen,
            instead="Run the worker in that process (delayqueue_django.worker."
            "start_worker_thread(), or call_command('run_delayqueue', burst=True) in tests), "
            "or give the queue a Redis URL.",
        )
        return handlers

    def _worker_for(
        self, queues: list[str], *, link: SupervisorLink | None, **options: Any
    ) -> Worker:
        handlers = self._handlers_for(queues)
        if link is None:
            return Worker(handlers, **options)
        watcher = MessageReports(link) if link.report_messages else None
        return Worker(handlers, pool_watcher=watcher, supervisor_pid=link.supervisor_pid, **options)

    def _run(self, worker: Worker, verbosity: int, link: SupervisorLink | None = None) -> None:
        signals = self._signals(worker) if link is None else child_signals(worker)
        with self.package_log(verbosity), signals:
            # Printed once the signal handlers are in place: a supervisor (or a test) that
            # sees it knows SIGTERM now means a clean stop.
            self._banner(worker, verbosity)
            self._advise([consumer.queue for consumer in worker.consumers])
            if link is not None:
                link.ready(worker.worker_id)
                link.watch(partial(stop_gracefully, worker))
            try:
                worker.run()
            except KeyboardInterrupt:
                # The caller's Ctrl-C (call_command: see stop_signals): leave at once, as on
                # a second signal, so that no thread of this worker goes on fetching.
                worker.request_stop()
                worker.request_stop()
                raise
        if verbosity >= 1:
            self.stdout.write(
                f"Worker {worker.worker_id} stopped: "
                f"{worker.handled} handled, {worker.failed} failed."
            )
        if worker.gave_up is not None:
            raise CommandError(
                f"cannot reach Redis at {worker.gave_up} for {worker.outages.give_up_after:g} s: "
                "a --burst run gives up; the messages stay in Redis",
                returncode=GAVE_UP,
            )

    def _run_until_reload(self, start: Callable[[], Worker], verbosity: int, checks: bool) -> None:
        """``--reload``, in the restarted process: runs in a thread of its own while the main
        thread watches the modules. A change stops the worker as SIGTERM would (running
        handlers finish, buffered messages go back), then the process restarts."""
        try:
            worker = start()
            if checks:
                self.check(display_num_errors=True)
        except CommandError as error:
            self.stderr.write(f"{error}\nThe worker starts again when a file is saved.")
            origin = _origin(error)
            if origin is not None:
                # Raised for the reloader, which then watches the file it came from too
                # (a module that failed to import is not among the loaded ones).
                raise origin from None
            return
        finished = threading.Event()

        def stop_before_reload(sender: Any, file_path: Path, **kwargs: Any) -> None:
            self.stdout.write(f"{file_path} changed: stopping the worker to restart it.")
            self.stdout.flush()
            worker.request_stop()
            finished.wait(worker.grace + 5)
            # Returning nothing lets the reloader restart the process.

        autoreload.file_changed.connect(stop_before_reload, weak=False)
        try:
            self._run(worker, verbosity)
        finally:
            finished.set()

    def _banner(self, worker: Worker, verbosity: int) -> None:
        if verbosity < 1:
            return
        mode = "burst" if worker.burst else "until stopped"
        self.stdout.write(
            f"delayqueue_django worker {worker.worker_id} ({mode}), "
            f"concurrency {worker.concurrency}"
            + (
                ""
                if worker.loop_pool is None
                else f", async concurrency {worker.async_concurrency} on an event loop"
            )
        )
        for consumer in worker.consumers:
            config = consumer.queue.config
            handler = getattr(consumer.handler, "__qualname__", repr(consumer.handler))
            module = getattr(consumer.handler, "__module__", "")
            kind = "async handler" if consumer.on_loop else "handler"
            self.stdout.write(
                f"  queue {config.name!r}: {describe_connection(consumer.queue)}, {kind} "
                f"{module}.{handler}, retries {config.retry_count}, max consume "
                f"{config.max_consume_ms / 1000:g} s, "
                f"batch {worker.batch_size or config.fetch_batch_size}"
                + (f", exactly once on {config.exactly_once!r}" if config.exactly_once else "")
            )
            for line in limits_lines(consumer.queue):
                self.stdout.write(line)
        if worker.relay is not None and worker.relay.databases:
            databases = ", ".join(map(repr, worker.relay.databases))
            self.stdout.write(f"  outbox relay: database {databases}")
        # Under systemd or Kubernetes stdout is a pipe: show the banner now, not when a
        # buffer fills.
        self.stdout.flush()

    def _advise(self, queues: list[Queue]) -> None:
        """Log what the queues' Redis servers say an operator should know (an evicting
        maxmemory-policy, a cache pool without socket timeout); refuse to start on a server
        too old for the queue's Lua."""
        logger = logging.getLogger("delayqueue_django.worker")
        try:
            advice = redis_checks.advise(queues)
        except UnsupportedRedisVersion as error:
            raise CommandError(str(error)) from None
        for said in advice:
            logger.log(said.level, "queue=%s: %s", said.queue, said.message)

    def _supervise(
        self,
        queues: list[str],
        *,
        processes: int,
        concurrency: int,
        grace: float,
        burst: bool,
        max_memory: float | None,
        heartbeat: float,
        verbosity: int,
        checks: bool = False,
    ) -> None:
        # Checked here once, so that a wrong setting or handler is one error, not one per
        # worker process; imported here too, for --reload to watch the handlers' modules.
        handlers = self._handlers_for(queues)
        if checks:  # --reload: the checks skipped at the command's start
            self.check(display_num_errors=True)
        if max_memory is not None:
            unmet = memory.unmet_by_a_fresh_process(max_memory)
            if unmet is not None:
                raise CommandError(unmet)
        chosen = [queue for queue, _ in handlers]
        # An async handler's limit is a cancellation on its process's loop (the others on
        # the loop go on): never a reason to kill the process.
        limits = {
            queue.name: queue.config.time_limit
            for queue, handler in handlers
            if queue.config.time_limit is not None and not is_async(handler)
        }
        env = {k: v for k, v in os.environ.items() if k != autoreload.DJANGO_AUTORELOAD_ENV}
        supervisor = Supervisor(
            processes=processes,
            argv=autoreload.get_child_arguments(),
            env=env,
            queues=chosen,
            grace=grace,
            burst=burst,
            max_memory_mb=max_memory,
            heartbeat_interval=heartbeat,
            # With threads, a process cannot be killed for one handler: the others would
            # go with it. There the handler checks its time itself (Message.time_left).
            time_limits=limits if concurrency == 1 else {},
        )
        self._current_supervisor = supervisor
        with self.package_log(verbosity), supervisor_signals(supervisor, self.stop_signals()):
            if verbosity >= 1:
                self.stdout.write(
                    f"delayqueue_django supervisor {supervisor.supervisor_id}: {processes} "
                    f"worker process{'es' if processes != 1 else ''}, concurrency "
                    f"{concurrency} each"
                )
                self.stdout.flush()
            if max_memory is not None and not memory.can_measure():
                logging.getLogger("delayqueue_django.worker").warning(
                    "--max-memory: this system does not show a process's memory (no /proc); "
                    "worker processes are not recycled for their size"
                )
            try:
                code = supervisor.run()
            except ChildCannotStart as error:
                raise CommandError(str(error)) from None
        if verbosity >= 1:
            self.stdout.write(supervisor.closing_line())
            self.stdout.flush()
        if code == GAVE_UP:
            raise CommandError(
                "a worker process gave up on a Redis it could not reach (--burst); the "
                "messages stay in Redis",
                returncode=GAVE_UP,
            )
        if supervisor.left_at_once and not supervisor.failed_exits:
            # Asked for (a second signal), and said so above: exit 1, as a worker does,
            # without an error of the command's.
            raise SystemExit(1)
        if code:
            raise CommandError("worker processes did not all stop cleanly", returncode=code)

    def _supervise_until_reload(self, supervise: Callable[[], None]) -> None:
        """``--reload --processes``, in the restarted process: the supervisor runs in a thread
        of its own while the main thread watches the modules; a change stops every worker
        process gracefully, then this process restarts with the code as it is now."""

        def stop_before_reload(sender: Any, file_path: Path, **kwargs: Any) -> None:
            supervisor = getattr(self, "_current_supervisor", None)
            if supervisor is None:
                return
            self.stdout.write(f"{file_path} changed: stopping the workers to restart them.")
            self.stdout.flush()
            supervisor.request_stop()
            finished.wait(supervisor.grace + 15)

        finished = threading.Event()
        autoreload.file_changed.connect(stop_before_reload, weak=False)
        try:
            supervise()
        except CommandError as error:
            self.stderr.write(f"{error}\nThe workers start again when a file is saved.")
            origin = _origin(error)
            if origin is not None:
                raise origin from None
        finally:
            finished.set()

    @contextmanager
    def _signals(self, worker: Worker) -> Iterator[None]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            # A stop that --max-messages began is no signal: this one is then the first.
            if worker.stop_requested.is_set():
                worker.request_stop()
                raise SystemExit(1)
            logger_name = signal.Signals(signum).name
            logging.getLogger("delayqueue_django.worker").info(
                "%s received: finishing running handlers (a second signal exits at once)",
                logger_name,
            )
            worker.request_stop()

        try:
            previous = {sig: signal.signal(sig, on_signal) for sig in self.stop_signals()}
        except ValueError:  # not the main thread: the caller stops the worker itself
            previous = {}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _origin(error: BaseException) -> BaseException | None:
    """What a handler module raised on import, at the root of a start-up error; None for a
    problem the package found itself (a setting, a missing module or function)."""
    found = error.__cause__
    return found.__cause__ if isinstance(found, HandlerNotFound) else None
