"""A worker process's line to the supervisor that started it (``run_delayqueue
--processes``): one end of a socket pair, whose number the supervisor passes in
SUPERVISOR_FD_ENV.

The child writes one JSON object a line: ``ready`` once it is about to fetch, and, when the
supervisor asks for it (REPORT_MESSAGES_ENV, for TIME_LIMIT's hard stop), what it holds:
``fetched`` (messages waiting for a handler), ``started``/``finished`` (a handler's run),
``released`` (handed back unstarted). Reading from the same socket tells the child when the
supervisor is gone (end of file): it then stops as on SIGTERM rather than run on unwatched.
"""

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from delayqueue_django.core.message import Message

logger = logging.getLogger("delayqueue_django.worker")

SUPERVISOR_FD_ENV = "DELAYQUEUE_SUPERVISOR_FD"
REPORT_MESSAGES_ENV = "DELAYQUEUE_REPORT_MESSAGES"


def message_to_json(message: Message) -> dict[str, Any]:
    return dataclasses.asdict(message)


def message_from_json(data: dict[str, Any]) -> Message:
    return Message(**data)


class SupervisorLink:
    """The child's end: reports sent as lines, thread-safe."""

    def __init__(self, sock: socket.socket, *, report_messages: bool) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.report_messages = report_messages
        self.supervisor_pid = os.getppid()

    @classmethod
    def from_environment(cls) -> "SupervisorLink | None":
        """The link to the supervisor, when this process is one of its children."""
        fd = os.environ.get(SUPERVISOR_FD_ENV)
        if not fd:
            return None
        sock = socket.socket(fileno=int(fd))
        return cls(sock, report_messages=os.environ.get(REPORT_MESSAGES_ENV) == "1")

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}).encode() + b"\n"
        # OSError: the supervisor is gone, and watch() stops this worker.
        with self._lock, contextlib.suppress(OSError):
            self._sock.sendall(line)

    def ready(self, worker_id: str) -> None:
        self.send("ready", worker_id=worker_id)

    def watch(self, on_supervisor_gone: Callable[[], None]) -> None:
        """Call ``on_supervisor_gone`` (in a thread of its own) when the supervisor's end
        closes: it died or was killed, and no one would stop or replace this process."""

        def wait_for_end() -> None:
            try:
                while self._sock.recv(4096):
                    pass
            except OSError:
                pass
            logger.warning("the supervisor (pid %d) is gone: stopping", self.supervisor_pid)
            on_supervisor_gone()

        threading.Thread(
            target=wait_for_end, name="delayqueue-supervisor-link", daemon=True
        ).start()


class MessageReports:
    """What a HandlerPool tells the supervisor about the messages it holds (a PoolWatcher)."""

    def __init__(self, link: SupervisorLink) -> None:
        self.link = link

    def fetched(self, messages: list[Message]) -> None:
        self.link.send("fetched", messages=[message_to_json(m) for m in messages])

    def started(self, message: Message) -> None:
        self.link.send("started", id=message.id, queue=message.queue)

    def finished(self, message: Message) -> None:
        self.link.send("finished", id=message.id, queue=message.queue)

    def released(self, messages: list[Message]) -> None:
        self.link.send("released", ids=[[m.queue, m.id] for m in messages])
