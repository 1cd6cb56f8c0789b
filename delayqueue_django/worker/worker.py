"""The worker: consumers for the chosen queues, one shared pool of handler threads, and the
two-step shutdown.

First stop request (SIGTERM, SIGINT, ``--max-messages`` reached): stop fetching, hand back
what was fetched but not started, let running handlers finish for up to ``grace`` seconds,
commit their verdicts, exit. Second request: leave at once; deliveries still running come back
through their deadline.
"""

import logging
import os
import random
import socket
import threading
import time
from secrets import token_hex
from typing import Any

from delayqueue_django.handlers import Handler
from delayqueue_django.queue import Queue
from delayqueue_django.worker.consumer import QueueConsumer
from delayqueue_django.worker.pool import HandlerPool

logger = logging.getLogger("delayqueue_django.worker")


class Worker:
    def __init__(
        self,
        queues: list[tuple[Queue, Handler]],
        *,
        concurrency: int = 1,
        batch_size: int | None = None,
        burst: bool = False,
        max_messages: int | None = None,
        grace: float = 30.0,
        jitter: float = 0.0,
        heartbeat_interval: float = 10.0,
    ) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.burst = burst
        self.max_messages = max_messages
        self.grace = grace
        self.jitter = jitter
        self.heartbeat_interval = heartbeat_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{token_hex(3)}"
        self.started_at = time.time()
        self.stopping = threading.Event()
        self.abandoning = threading.Event()
        self.pool = HandlerPool(concurrency, on_slot_freed=self._wake_starved_consumers)
        self.consumers = [QueueConsumer(self, queue, handler) for queue, handler in queues]
        self._counts_lock = threading.Lock()
        self.handled = 0
        self.failed = 0

    # Shared state, used by the consumers

    def count(self, *, handled: int, failed: int) -> None:
        with self._counts_lock:
            self.handled += handled
            self.failed += failed
            reached = self.max_messages is not None and self.handled >= self.max_messages
        if reached and not self.stopping.is_set():
            logger.info("handled %d messages (--max-messages); stopping", self.handled)
            self.request_stop()

    def quota(self) -> int | None:
        """How many more messages may be fetched, or None without --max-messages."""
        if self.max_messages is None:
            return None
        with self._counts_lock:
            in_flight = sum(consumer.in_flight for consumer in self.consumers)
            return max(self.max_messages - self.handled - in_flight, 0)

    def details(self) -> dict[str, Any]:
        host, pid = socket.gethostname(), os.getpid()
        return {
            "host": host,
            "pid": pid,
            "queues": [consumer.queue.name for consumer in self.consumers],
            "concurrency": self.concurrency,
            "started": self.started_at,
            "handled": self.handled,
            "failed": self.failed,
            "last_seen": time.time(),
        }

    def _wake_starved_consumers(self) -> None:
        # Only those that may fetch now: waking one per finished message for nothing
        # would cost its loop a turn each time.
        for consumer in self.consumers:
            if consumer.starved and consumer.has_room():
                consumer.wake()

    # Running and stopping

    def request_stop(self) -> None:
        """First call: stop gracefully. A second call (the second signal) leaves at once."""
        if self.stopping.is_set():
            logger.warning("second stop request: leaving now; running deliveries come back later")
            self.abandoning.set()
        self.stopping.set()
        for consumer in self.consumers:
            consumer.wake()

    def run(self) -> None:
        if self.jitter > 0:
            delay = random.uniform(0, self.jitter)
            logger.info("start-up jitter: waiting %.2f s", delay)
            if self.stopping.wait(delay):
                return
        self.pool.start()
        for consumer in self.consumers:
            consumer.start()
        stop_requested_at: float | None = None
        while not all(consumer.finished.is_set() for consumer in self.consumers):
            # Short waits keep the main thread responsive to signals.
            self.consumers[0].finished.wait(0.1)
            if self.abandoning.is_set():
                break
            if self.stopping.is_set():
                stop_requested_at = stop_requested_at or time.monotonic()
                if time.monotonic() - stop_requested_at > self.grace:
                    logger.warning(
                        "handlers still running after the %.0f s grace period; leaving them "
                        "to come back through their deadline",
                        self.grace,
                    )
                    self.abandoning.set()
                    break
            elif self.burst and all(c.finished.is_set() for c in self.consumers):
                break
        self.stopping.set()
        for consumer in self.consumers:
            consumer.wake()
            consumer.finished.wait(2.0)
        self.pool.close()
