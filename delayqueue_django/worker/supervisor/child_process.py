"""One worker process as its supervisor sees it: the running ``run_delayqueue`` copy, the
socket it reports on (supervisor.link), and what it said it holds."""

import contextlib
import json
import logging
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from delayqueue_django.core.message import Message
from delayqueue_django.worker.supervisor.link import (
    REPORT_MESSAGES_ENV,
    SUPERVISOR_FD_ENV,
    message_from_json,
)

logger = logging.getLogger("delayqueue_django.worker")

# What a child takes as the supervisor's second stop request: leave at once. Not a second
# SIGTERM, which the child may get from elsewhere too (a service manager signalling the
# whole group): there SIGTERM only ever means the graceful stop.
IMMEDIATE_STOP = signal.SIGUSR1

MessageKey = tuple[str, str]  # (queue, id)

# How long the reader waits for a child whose end of the socket closed to be reapable.
EXIT_AFTER_EOF_SECONDS = 5.0


class ChildProcess:
    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        report_messages: bool,
        on_news: Callable[[], None] = lambda: None,
    ) -> None:
        ours, theirs = socket.socketpair()
        env = {
            **env,
            SUPERVISOR_FD_ENV: str(theirs.fileno()),
            REPORT_MESSAGES_ENV: "1" if report_messages else "0",
        }
        try:
            self.process = subprocess.Popen(list(argv), env=env, pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self._sock = ours
        self.started_at = time.monotonic()
        self.ready = threading.Event()
        self.worker_id: str | None = None
        # Why the supervisor stopped it (None: it was not asked to stop).
        self.stop_reason: str | None = None
        # When the supervisor first saw it over --max-memory (time.monotonic()), or None.
        self.over_memory_since: float | None = None
        self._lock = threading.Lock()
        self._buffered: dict[MessageKey, Message] = {}
        self._running: dict[MessageKey, tuple[Message, float]] = {}
        # Called (from the reader thread) when it says it is ready, and when its end of the
        # socket closes: it exited, most likely.
        self._on_news = on_news
        self._reader = threading.Thread(
            target=self._read, name=f"delayqueue-child-{self.pid}", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self, reason: str) -> None:
        """The graceful stop: running handlers finish, buffered messages go back."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._signal(signal.SIGTERM)

    def stop_now(self) -> None:
        self._signal(IMMEDIATE_STOP)

    def kill(self, reason: str) -> None:
        self.stop_reason = reason
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def running(self) -> list[tuple[Message, float]]:
        """The messages its handlers run, each with when it started (time.monotonic())."""
        with self._lock:
            return list(self._running.values())

    def buffered(self) -> list[Message]:
        """The messages it fetched and has not started."""
        with self._lock:
            return list(self._buffered.values())

    def close(self) -> None:
        self._sock.close()
        self._reader.join(timeout=2)

    def _read(self) -> None:
        try:
            with self._sock.makefile("rb") as lines:
                for line in lines:
                    self._take(json.loads(line))
        except (OSError, ValueError):
            pass  # the child died mid-line, or the socket was closed by close()
        # Its end closes as it exits, a moment before it can be reaped: the news is told
        # once it can be.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=EXIT_AFTER_EOF_SECONDS)
        self._on_news()

    def _take(self, report: dict) -> None:  # type: ignore[type-arg]
        event = report.get("event")
        now = time.monotonic()
        with self._lock:
            if event == "ready":
                self.worker_id = report.get("worker_id")
                self.ready.set()
                self._on_news()
            elif event == "fetched":
                for data in report["messages"]:
                    message = message_from_json(data)
                    self._buffered[(message.queue, message.id)] = message
            elif event == "started":
                key = (report["queue"], report["id"])
                started = self._buffered.pop(key, None)
                if started is not None:
                    self._running[key] = (started, now)
            elif event == "finished":
                self._running.pop((report["queue"], report["id"]), None)
            elif event == "released":
                for queue, message_id in report["ids"]:
                    self._buffered.pop((queue, message_id), None)


def describe_exit(code: int) -> str:
    """An exit status as a person reads it: "exit status 1", "killed by SIGKILL"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
