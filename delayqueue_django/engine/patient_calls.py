"""Calls waited for a bounded time, each in a thread of its own, the threads kept for reuse.

A paused Redis server (stopped, swapping, a network partition that drops packets) answers
nothing: its caller waits out the socket timeout, and redis-py's retries after it. Run here,
such a call holds only its own thread; the caller stops waiting after its patience, with a
``TimeoutError``, and goes on. The threads are daemons: a call that hangs never holds up the
process's exit.
"""

import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class PatientCalls:
    """Runs calls in daemon threads, reusing those whose last call is over: as many threads
    as calls ever ran at once (a hung call keeps its own until redis-py gives up)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[SimpleQueue[_Job]] = []

    def call(self, function: Callable[[], T], patience: float) -> T:
        """``function()``'s result or error; ``TimeoutError`` if it took longer than
        ``patience`` seconds (it runs on regardless)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name=self._name, daemon=True
            ).start()
        future: Future[T] = Future()
        inbox.put((function, future))
        # (concurrent.futures.TimeoutError is the built-in TimeoutError.)
        return future.result(patience)

    def _serve(self, inbox: "SimpleQueue[_Job]") -> None:
        while True:
            function, future = inbox.get()
            try:
                future.set_result(function())
            except BaseException as error:  # the caller's to handle
                future.set_exception(error)
            with self._lock:
                self._idle.append(inbox)
