"""Watching the worker's event loop for code that blocks it.

A coroutine that calls ``time.sleep``, a sync HTTP client or the sync ORM holds the loop's
only thread: every other coroutine waits, heartbeats stall, time limits fire late. asyncio
says nothing of it outside its debug mode (too costly to run in production). So a thread of
its own asks the loop, while it has work, to run a trivial callback; one not run within
``blocked_after`` seconds means something holds the loop. The loop thread's stack is read
then, while it is still blocked (so the report says where, not what ran after), and once
the loop answers, the block is logged with its length and the message whose handler held
it, and counted for the heartbeat and the metrics.

An idle loop is not asked: the watch waits to be woken by work, and costs nothing.
"""

import logging
import sys
import threading
import time
import traceback
from asyncio import AbstractEventLoop
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from delayqueue_django.engine import loggable

logger = logging.getLogger("delayqueue_django.worker")

# How many of the blocking code's innermost frames a report shows.
REPORTED_FRAMES = 6


@dataclass(frozen=True, slots=True)
class Block:
    """Where the loop was found blocked: the message whose handler held it, if any (its
    queue and id), and the innermost frames, innermost last."""

    queue: str | None
    message_id: str | None
    stack: list[str]

    @property
    def where(self) -> str:
        return self.stack[-1].strip().splitlines()[0] if self.stack else "an unknown place"


class _Probe:
    """A callback the loop is asked to run: when it ran (time.monotonic())."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answered_at = 0.0

    def answer(self) -> None:
        self.answered_at = time.monotonic()
        self.done.set()


class LoopWatch:
    def __init__(
        self,
        loop: AbstractEventLoop,
        blocked_after: float,
        *,
        busy: Callable[[], int],
        job_runner: CodeType | None = None,
        on_block: Callable[[Block, float], None] | None = None,
    ) -> None:
        self.loop = loop
        self.blocked_after = blocked_after
        self._busy = busy
        # The code of the coroutine that runs one job (LoopPool._run): its frame on the
        # blocked stack holds the job, so the message.
        self.job_runner = job_runner
        # Told of each block reported (the worker adds it to its queue's timings).
        self.on_block = on_block
        self._loop_thread: threading.Thread | None = None
        self._woken = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.blocks = 0
        self.blocked_seconds = 0.0
        self.longest_block = 0.0
        self._thread = threading.Thread(
            target=self._watch, name="delayqueue-loop-watch", daemon=True
        )

    def start(self, loop_thread: threading.Thread) -> None:
        self._loop_thread = loop_thread
        self._thread.start()

    def woken(self) -> None:
        """Work was handed to the loop: watch it (a no-op while watching already)."""
        if not self._woken.is_set():
            self._woken.set()

    def stop(self) -> None:
        self._stopped.set()
        self._woken.set()

    def counts(self) -> dict[str, Any]:
        """For the heartbeat: blocks reported since start, their total and longest seconds."""
        with self._lock:
            return {
                "loop_blocks": self.blocks,
                "loop_blocked_seconds": round(self.blocked_seconds, 3),
                "loop_longest_block": round(self.longest_block, 3),
            }

    def _watch(self) -> None:
        while not self._stopped.is_set():
            if self._busy() == 0:
                self._woken.wait()
                self._woken.clear()
                continue
            probe = _Probe()
            asked = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(probe.answer)
            except RuntimeError:  # the loop closed: the worker is leaving
                return
            if probe.done.wait(self.blocked_after):
                self._stopped.wait(self.blocked_after)  # the next look, while busy
                continue
            block = self._read_stack()
            while not probe.done.wait(1.0):
                if self._stopped.is_set():
                    return
            self._report(probe.answered_at - asked, block)

    def _read_stack(self) -> Block:
        thread = self._loop_thread
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        if frame is None:
            return Block(None, None, [])
        queue = message_id = None
        frames: list[FrameType] = []
        walked: FrameType | None = frame
        while walked is not None:
            if walked.f_code is self.job_runner:
                job = walked.f_locals.get("job")
                message = getattr(job, "message", None)
                queue = getattr(message, "queue", None)
                message_id = getattr(message, "id", None)
                break
            frames.append(walked)
            walked = walked.f_back
        innermost = list(reversed(frames))[-REPORTED_FRAMES:]
        stack = traceback.StackSummary.extract(
            ((each, each.f_lineno) for each in innermost), lookup_lines=True
        ).format()
        return Block(queue, message_id, stack)

    def _report(self, seconds: float, block: Block) -> None:
        with self._lock:
            self.blocks += 1
            self.blocked_seconds += seconds
            self.longest_block = max(self.longest_block, seconds)
        if self.on_block is not None:
            self.on_block(block, seconds)
        stack = "".join(block.stack).rstrip()
        if block.message_id is None:
            logger.warning(
                "the event loop was blocked for %.1f s (not in a handler), at %s; blocking code "
                "stalls every coroutine of the worker\n%s",
                seconds,
                block.where,
                stack,
            )
            return
        logger.warning(
            "handler blocked the event loop for %.1f s: message id=%s queue=%s, at %s; "
            "blocking code in an async handler stalls every coroutine of the worker (await "
            "an async client, or run it with sync_to_async)\n%s",
            seconds,
            loggable(block.message_id),
            block.queue,
            block.where,
            stack,
        )
