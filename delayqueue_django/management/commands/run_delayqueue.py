"""``manage.py run_delayqueue [QUEUE ...]``: deliver due messages to their handlers."""

import argparse
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.management.base import CommandError, CommandParser

from delayqueue_django import registry
from delayqueue_django.conf import QueueConfig
from delayqueue_django.exceptions import QueueConfigurationError, UnknownQueue
from delayqueue_django.handlers import HandlerNotFound, resolve
from delayqueue_django.management.own_process import OwnProcessCommand
from delayqueue_django.worker import Worker

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {text}")
    return value


def describe_connection(config: QueueConfig) -> str:
    if config.redis_alias is not None:
        return f"cache {config.redis_alias!r}"
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
            "--concurrency",
            type=positive_int,
            default=1,
            help="Handler threads in this process (default: 1).",
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
            "--heartbeat",
            type=non_negative_seconds,
            default=10.0,
            help="Seconds between heartbeats published for the admin (default: 10).",
        )

    def handle(
        self,
        *args: Any,
        queues: list[str],
        burst: bool,
        concurrency: int,
        batch_size: int | None,
        max_messages: int | None,
        grace: float,
        jitter: float,
        heartbeat: float,
        verbosity: int,
        **options: Any,
    ) -> None:
        try:
            names = list(queues) or registry.queue_names()
            if not names:
                raise CommandError("DELAYQUEUES defines no queue: nothing to consume.")
            chosen = [registry.get_queue(name) for name in dict.fromkeys(names)]
            handlers = [(queue, resolve(queue.config)) for queue in chosen]
        except (QueueConfigurationError, UnknownQueue, HandlerNotFound) as error:
            raise CommandError(str(error)) from None
        self.refuse_memory_queues(
            chosen,
            instead="Run the worker in that process (delayqueue_django.worker."
            "start_worker_thread(), or call_command('run_delayqueue', burst=True) in tests), "
            "or give the queue a Redis URL.",
        )

        worker = Worker(
            handlers,
            concurrency=concurrency,
            batch_size=batch_size,
            burst=burst,
            max_messages=max_messages,
            grace=grace,
            jitter=jitter,
            heartbeat_interval=max(heartbeat, 0.1),
        )
        with self._logging(verbosity), self._signals(worker):
            # Printed once the signal handlers are in place: a supervisor (or a test) that
            # sees it knows SIGTERM now means a clean stop.
            self._banner(worker, verbosity)
            worker.run()
        if verbosity >= 1:
            self.stdout.write(
                f"Worker {worker.worker_id} stopped: "
                f"{worker.handled} handled, {worker.failed} failed."
            )

    def _banner(self, worker: Worker, verbosity: int) -> None:
        if verbosity < 1:
            return
        mode = "burst" if worker.burst else "until stopped"
        self.stdout.write(
            f"delayqueue_django worker {worker.worker_id} ({mode}), "
            f"concurrency {worker.concurrency}"
        )
        for consumer in worker.consumers:
            config = consumer.queue.config
            handler = getattr(consumer.handler, "__qualname__", repr(consumer.handler))
            module = getattr(consumer.handler, "__module__", "")
            self.stdout.write(
                f"  queue {config.name!r}: {describe_connection(config)}, handler "
                f"{module}.{handler}, retries {config.retry_count}, max consume "
                f"{config.max_consume_ms / 1000:g} s, "
                f"batch {worker.batch_size or config.fetch_batch_size}"
            )
        # Under systemd or Kubernetes stdout is a pipe: show the banner now, not when a
        # buffer fills.
        self.stdout.flush()

    @contextmanager
    def _logging(self, verbosity: int) -> Iterator[None]:
        """Show the package's log on this command's stdout, unless the project's LOGGING
        already gives the package a handler."""
        package = logging.getLogger("delayqueue_django")
        previous_level = package.level
        package.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        added = None
        if not package.handlers:
            added = logging.StreamHandler(self.stdout)
            added.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            package.addHandler(added)
        try:
            yield
        finally:
            package.setLevel(previous_level)
            if added is not None:
                package.removeHandler(added)

    @contextmanager
    def _signals(self, worker: Worker) -> Iterator[None]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            if worker.stopping.is_set():
                worker.request_stop()
                raise SystemExit(1)
            logger_name = signal.Signals(signum).name
            logging.getLogger("delayqueue_django.worker").info(
                "%s received: finishing running handlers (a second signal exits at once)",
                logger_name,
            )
            worker.request_stop()

        try:
            previous = {
                sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
            }
        except ValueError:  # not the main thread: the caller stops the worker itself
            previous = {}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
