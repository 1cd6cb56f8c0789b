"""The worker's event loop: ``async def`` handlers run here as coroutines, up to
``--async-concurrency`` at once, beside the handler threads that run sync ones.

One loop per worker process, in a thread of its own. It is fed as the thread pool is (see
pool.py): consumers submit fetched messages, which wait in a small buffer until a slot is
free, and a message that waited past its consumer's slack is handed back unstarted. Each
message runs as a task of its own, and reports its outcome to its consumer, whose thread
commits the verdicts in batches as it does for handler threads. A coroutine waiting on I/O
holds no thread, so a thousand can be in flight in one process.

The loop is also watched (loop_watch.py): a handler that blocks it (``time.sleep``, a sync
client) stalls every coroutine, and is reported with where it blocked.
"""

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.worker.handling import Outcome, Verdict
from delayqueue_django.worker.loop_watch import Block, LoopWatch
from delayqueue_django.worker.pool import Consumer, Job, JobBuffer, PoolWatcher, Running

logger = logging.getLogger("delayqueue_django.worker")


class AsyncConsumer(Consumer, Protocol):
    """What the loop asks of a consumer whose messages it runs: a coroutine per message."""

    def ahandle(self, message: Message) -> Coroutine[Any, Any, Outcome]: ...


class LoopPool(JobBuffer):
    def __init__(
        self,
        concurrency: int,
        on_room_freed: Callable[[], None] = lambda: None,
        watcher: PoolWatcher | None = None,
        blocked_after: float = 0.1,
        on_block: Callable[[Block, float], None] | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.watcher = watcher
        self.on_room_freed = on_room_freed
        self.loop = asyncio.new_event_loop()
        self._jobs: deque[Job] = deque()
        # What each task runs, by the task's number (the loop thread adds and removes them;
        # consumer threads read them, under the lock).
        self._running: dict[int, Running] = {}
        self._numbers = itertools.count()
        # Strong references: the loop keeps only weak ones to its tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Coroutines other threads asked the loop to run (run_from_thread), not done yet.
        self._calls = 0
        # A call of _room_freed is planned for the loop's next turn (only the loop's thread
        # reads or sets it).
        self._room_freed_pending = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run_loop, name="delayqueue-event-loop", daemon=True
        )
        self.watch = LoopWatch(
            self.loop,
            blocked_after,
            busy=self.outstanding,
            job_runner=LoopPool._run.__code__,
            on_block=on_block,
        )

    def start(self) -> None:
        self._thread.start()
        self.watch.start(self._thread)

    def outstanding(self) -> int:
        """Messages handed to the loop and not finished: running or waiting for a slot."""
        with self._lock:
            return len(self._running) + len(self._jobs)

    def running(self) -> list[Running]:
        """The jobs running now, the longest-running first: in the order they started, which
        is their numbers' (a dict keeps the order of insertion), so with no sort. Consumers
        ask at every turn of theirs, with up to --async-concurrency tasks running."""
        with self._lock:
            return list(self._running.values())

    def submit(self, consumer: AsyncConsumer, messages: list[Message]) -> None:
        now = time.monotonic()
        if self.watcher is not None:
            self.watcher.fetched(messages)
        with self._lock:
            self._jobs.extend(Job(consumer, message, now) for message in messages)
        self.loop.call_soon_threadsafe(self._start_jobs)
        self.watch.woken()

    def run_from_thread(self, coroutine: Coroutine[Any, Any, None]) -> bool:
        """Run ``coroutine`` on the loop and wait for it, from another thread (signal
        receivers that are ``async def``, awaited where the handlers run); False, with the
        coroutine closed unrun, once the loop is closing or from the loop's own thread,
        where the caller has to run it some other way."""
        with self._lock:
            usable = not self._closed and threading.current_thread() is not self._thread
            if usable:
                self._calls += 1
        if not usable:
            coroutine.close()
            return False
        try:
            asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()
        finally:
            with self._lock:
                self._calls -= 1
            if self._closed:
                self._call_soon(self._stop_if_done)
        return True

    def close(self) -> None:
        """Let the loop finish what is buffered and running, then end."""
        with self._lock:
            self._closed = True
        self.watch.stop()
        self._call_soon(self._stop_if_done)

    def _call_soon(self, callback: Callable[[], None]) -> None:
        # A loop closed already has nothing left to stop.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback)

    # On the loop's thread

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except (SystemExit, KeyboardInterrupt) as error:
                    # asyncio lets these out of any task or callback, ending run_forever: a
                    # task a handler spawned (a library's sys.exit(), say) would end the
                    # loop, the coroutines on it left unfinished and every message after
                    # them handed back, the worker serving nothing. Only the worker's own
                    # stop ends it (see close): the loop goes on.
                    logger.error(
                        "%s raised on the event loop (by a task or callback a handler "
                        "started); ignored: the worker stops only when asked to",
                        type(error).__name__,
                        exc_info=(type(error), error, error.__traceback__),
                    )
                    continue
                return
        finally:
            self.loop.close()

    def _start_jobs(self) -> None:
        while True:
            with self._lock:
                if not self._jobs or len(self._running) >= self.concurrency:
                    break
                job = self._jobs.popleft()
                number = next(self._numbers)
                self._running[number] = Running(job, time.monotonic())
            task = self.loop.create_task(self._run(number, job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._stop_if_done()

    def _stop_if_done(self) -> None:
        with self._lock:
            done = self._closed and not self._jobs and not self._running and not self._calls
        if done:
            self.loop.stop()

    async def _run(self, number: int, job: Job) -> None:
        if self.watcher is not None:
            self.watcher.started(job.message)
        consumer: AsyncConsumer = job.consumer  # type: ignore[assignment]
        try:
            if consumer.is_stale(job.fetched_at):
                outcome = Outcome(job.message, Verdict.RELEASE)
            else:
                outcome = await consumer.ahandle(job.message)
        except BaseException as error:
            # acall_handler lets nothing of the handler's escape; anything that does all the
            # same (a bug around the call) must leave the delivery with a verdict: refused.
            logger.error(
                "unexpected error around the handler call message id=%s queue=%s",
                loggable(job.message.id),
                job.message.queue,
                exc_info=(type(error), error, error.__traceback__),
            )
            outcome = Outcome(job.message, Verdict.NACK, error)
        finally:
            with self._lock:
                del self._running[number]
            if self.watcher is not None:
                self.watcher.finished(job.message)
        consumer.report(outcome)
        self._room_freed_soon()

    def _room_freed_soon(self) -> None:
        """Tell the room freed once for all the tasks that finish in this turn of the loop:
        a batch whose handlers awaited the same I/O, or timers due together, ends in one
        turn, and each look at a consumer's room reads every running task (a thousand in
        flight made that a million reads per thousand messages)."""
        if not self._room_freed_pending:
            self._room_freed_pending = True
            self.loop.call_soon(self._room_freed)

    def _room_freed(self) -> None:
        self._room_freed_pending = False
        self.on_room_freed()
        self._start_jobs()
