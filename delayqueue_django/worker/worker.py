"""The worker: consumers for the chosen queues, one shared pool of handler threads, and the
two-step shutdown.

First stop request (SIGTERM, SIGINT, a reload), or ``--max-messages`` reached: stop fetching,
hand back what was fetched but not started, let running handlers finish for up to ``grace``
seconds, commit their verdicts, exit. Second request: leave at once; deliveries still running
come back through their deadline. Reaching ``--max-messages`` is no request: by then nothing
is in flight (fetches take no more than the limit leaves, see ``reserve``), and the first
signal after it is still the graceful one.

A burst run whose Redis stays unreachable for ``give_up_after`` seconds stops as on a first
request (``gave_up`` names the server), except that it does not keep retrying through the
grace the verdicts that Redis would not take (see QueueConsumer): a cron job or a CI step
must end, where a worker run until stopped waits for Redis however long it takes.
"""

import logging
import os
import random
import socket
import threading
import time
from secrets import token_hex
from typing import Any

from delayqueue_django.core.conf.loop import loop_blocked_after
from delayqueue_django.core.handlers import Handler, is_async, loop_router
from delayqueue_django.core.queue import Queue
from delayqueue_django.outbox.databases import outbox_databases
from delayqueue_django.outbox.prune_rounds import PruneRounds
from delayqueue_django.outbox.relay import RELAY_POLL_SECONDS, OutboxRelay
from delayqueue_django.worker.consumer import QueueConsumer
from delayqueue_django.worker.consumer.state import ConsumerState
from delayqueue_django.worker.loop_pool import LoopPool
from delayqueue_django.worker.loop_watch import Block
from delayqueue_django.worker.outages import Outages
from delayqueue_django.worker.pool import HandlerPool, PoolWatcher, Running

logger = logging.getLogger("delayqueue_django.worker")

# At the default verbosity the worker logs a summary of the messages handled at most this
# often (at -v 2, also a line per message).
SUMMARY_SECONDS = 10.0
# How often a worker prunes the processed ids of its EXACTLY_ONCE queues.
PRUNE_PROCESSED_SECONDS = 60.0
# How often the main thread of a worker looks at its state (a stop request, an outage
# given up on, the grace's end); consumers finishing wake it at once.
IDLE_LOOK_SECONDS = 1.0
STOPPING_LOOK_SECONDS = 0.1
# The longest-running handlers a heartbeat names (running_count counts them all).
RUNNING_REPORTED = 20
# How long a burst run waits for a Redis it cannot reach before it gives up. Long enough for
# a Redis restart (loading a dataset of some GB takes tens of seconds) or a failover
# (Sentinel's default down-after is 30 s, Redis Cluster's node timeout 15 s), which the burst
# then rides out; short enough that a cron job every few minutes ends before its next run.
BURST_OUTAGE_SECONDS = 60.0


class Worker:
    def __init__(
        self,
        queues: list[tuple[Queue, Handler]],
        *,
        concurrency: int = 1,
        async_concurrency: int = 100,
        batch_size: int | None = None,
        burst: bool = False,
        max_messages: int | None = None,
        grace: float = 30.0,
        jitter: float = 0.0,
        heartbeat_interval: float = 10.0,
        relay: bool = True,
        relay_poll: float = RELAY_POLL_SECONDS,
        give_up_after: float = BURST_OUTAGE_SECONDS,
        pool_watcher: PoolWatcher | None = None,
        supervisor_pid: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.batch_size = batch_size
        self.burst = burst
        self.max_messages = max_messages
        self.grace = grace
        self.jitter = jitter
        self.heartbeat_interval = heartbeat_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{token_hex(3)}"
        self.started_at = time.time()
        self._started_monotonic = time.monotonic()
        self.stopping = threading.Event()
        self._stop_requested_at: float | None = None
        # Set by the first stop request; not by --max-messages, which only stops gracefully.
        self.stop_requested = threading.Event()
        self.abandoning = threading.Event()
        self.pool = HandlerPool(
            concurrency, on_room_freed=self._wake_starved_consumers, watcher=pool_watcher
        )
        # The event loop for the queues whose handler is ``async def``; none without them.
        self.loop_pool: LoopPool | None = None
        if any(is_async(handler) or loop_router(handler) for _, handler in queues):
            self.loop_pool = LoopPool(
                async_concurrency,
                on_room_freed=self._wake_starved_consumers,
                watcher=pool_watcher,
                blocked_after=loop_blocked_after(),
                on_block=self._loop_blocked,
            )
        # The pid of the supervisor that started this process (run_delayqueue --processes).
        self.supervisor_pid = supervisor_pid
        # Created before the consumers, which report to it. Only a burst run gives up.
        self.outages = Outages(give_up_after=give_up_after if burst else None)
        # The Redis (host:port) a burst run stopped waiting for; None if it did not give up.
        self.gave_up: str | None = None
        self.consumers = [QueueConsumer(self, queue, handler) for queue, handler in queues]
        self._counts_lock = threading.Lock()
        self.handled = 0
        self.failed = 0
        # Handlers that ran past their queue's TIME_LIMIT (with threads: see time_limits).
        self.time_limit_overruns = 0
        # Under --max-messages, what each consumer's fetch under way may take (see reserve).
        self._reserved: dict[ConsumerState, int] = {}
        # The counts at the last summary line, and when it was logged (None: not yet).
        self._summarized = (0, 0)
        self._summarized_at: float | None = None
        # The database duties, in a thread of their own: relaying the outbox rows of these
        # queues (unless ``relay`` is off, or DELAYQUEUE_OUTBOX_DATABASES is empty), and
        # starting the rounds that prune the processed ids of those that are EXACTLY_ONCE.
        chosen = [queue for queue, _ in queues]
        self.exactly_once = [queue.name for queue in chosen if queue.config.exactly_once]
        databases = outbox_databases() if relay else []
        self.relay: OutboxRelay | None = None
        if databases or self.exactly_once:
            self.relay = OutboxRelay(chosen, databases=databases, poll_seconds=relay_poll)
        self._database_thread: threading.Thread | None = None

    # Shared state, used by the consumers

    def count(self, *, handled: int, failed: int) -> None:
        with self._counts_lock:
            self.handled += handled
            self.failed += failed
            reached = self.max_messages is not None and self.handled >= self.max_messages
        self.summarize()
        if reached and not self.stopping.is_set():
            logger.info("handled %d messages (--max-messages); stopping", self.handled)
            self._stop_gracefully()

    def count_time_limit_overrun(self) -> None:
        with self._counts_lock:
            self.time_limit_overruns += 1

    def summarize(self) -> None:
        """Log what was handled since the last summary line, if anything was and the last
        line is SUMMARY_SECONDS old (the default verbosity's view of the work, where a line
        per message would cost a busy worker more than its handlers). Called as verdicts
        are counted, so the first message after a quiet spell is told at once, and at each
        heartbeat, for the last ones of a burst."""
        if not logger.isEnabledFor(logging.INFO):
            return
        now = time.monotonic()
        with self._counts_lock:
            totals, last = (self.handled, self.failed), self._summarized_at
            if totals == self._summarized or (last is not None and now - last < SUMMARY_SECONDS):
                return
            handled, failed = totals[0] - self._summarized[0], totals[1] - self._summarized[1]
            self._summarized, self._summarized_at = totals, now
        logger.info(
            "handled %d message%s (%d failed) in the last %.0f s; %d (%d failed) since start",
            handled,
            "" if handled == 1 else "s",
            failed,
            now - (self._started_monotonic if last is None else last),
            *totals,
        )

    def reserve(self, consumer: ConsumerState, wanted: int) -> int:
        """How many messages ``consumer`` may fetch now, of the ``wanted``: all of them
        without --max-messages; else no more than the limit leaves once the messages
        handled, in flight and reserved for the other consumers' fetches are counted,
        reserved for this fetch until ``fetched``. Reserved under the lock: consumers
        fetching at the same moment never count on the same share, so exactly
        --max-messages are handled. A fetch that failed keeps its reservation, and its
        repeat is given the same count: if Redis ran it, the repeat gets what it took (see
        Queue.fetch), whatever count it asks for."""
        if self.max_messages is None:
            return wanted
        with self._counts_lock:
            if consumer in self._reserved:
                return self._reserved[consumer]
            in_flight = sum(each.in_flight for each in self.consumers)
            left = self.max_messages - self.handled - in_flight - sum(self._reserved.values())
            granted = min(wanted, max(left, 0))
            if granted:
                self._reserved[consumer] = granted
            return granted

    def fetched(self, consumer: ConsumerState) -> None:
        """``consumer``'s fetch returned, and what it took counts as in flight: its
        reservation ends, and what the fetch did not take is free again."""
        if self.max_messages is None:
            return
        with self._counts_lock:
            self._reserved.pop(consumer, None)
        self.shares_freed()

    def shares_freed(self) -> None:
        """Under --max-messages, a share of the limit may be free again (a fetch took less
        than it reserved, or a hand-back was committed): a consumer refused one meanwhile
        waits for it. (A hand-back woke them already, to look for room in the pool, while
        its messages still counted as in flight.)"""
        if self.max_messages is not None:
            self._wake_starved_consumers()

    def details(self) -> dict[str, Any]:
        host, pid = socket.gethostname(), os.getpid()
        # One look at what runs, for the handlers named and their count alike.
        running = self._running()
        return {
            "role": "worker",
            "host": host,
            "pid": pid,
            "supervisor": self.supervisor_pid,
            "queues": [consumer.queue.name for consumer in self.consumers],
            "concurrency": self.concurrency,
            **(
                {}
                if self.loop_pool is None
                else {"async_concurrency": self.async_concurrency, **self.loop_pool.watch.counts()}
            ),
            "started": self.started_at,
            "handled": self.handled,
            "failed": self.failed,
            "time_limit_overruns": self.time_limit_overruns,
            "last_seen": time.time(),
            "running": self.running_handlers(running),
            "running_count": len(running),
        }

    def running_handlers(self, running: list[Running]) -> list[dict[str, Any]]:
        """The ``running`` handlers, the longest-running first, at most RUNNING_REPORTED of
        them (with a thousand coroutines in flight, a heartbeat naming them all would weigh
        some 100 KB, written every beat): the message (id, queue, attempt), ``age`` (seconds
        since the handler started) and ``past_deadline`` (its delivery timed out: the next
        fetch of any worker delivers the message again)."""
        now = time.monotonic()
        longest = sorted(running, key=lambda each: each.started_at)
        return [
            {
                "id": running.job.message.id,
                "queue": running.job.message.queue,
                "attempt": running.job.message.attempt,
                "age": round(now - running.started_at, 1),
                "past_deadline": running.job.consumer.redis_now_ms()
                > running.job.message.deadline_ms,
            }
            for running in longest[:RUNNING_REPORTED]
        ]

    def _running(self) -> list[Running]:
        """What the handler threads and the event loop run now."""
        loop = [] if self.loop_pool is None else self.loop_pool.running()
        return self.pool.running() + loop

    def _loop_blocked(self, block: Block, seconds: float) -> None:
        """A handler held the event loop: observed in its queue's timings, for the metrics."""
        for consumer in self.consumers:
            if consumer.queue.name == block.queue:
                consumer.timings.observe("event_loop_blocked", seconds)
                return

    def _wake_starved_consumers(self) -> None:
        # Only those that may fetch now: waking one per finished message for nothing
        # would cost its loop a turn each time. Nor those already woken and yet to look
        # (see look_owed): asking them for room again would cost every handler's return.
        for consumer in self.consumers:
            if consumer.starved and not consumer.look_owed() and consumer.has_room():
                consumer.wake()

    # Running and stopping

    def request_stop(self) -> None:
        """First call: stop gracefully. A second call (the second signal) leaves at once.
        A graceful stop that --max-messages started counts as no call: the next one is the
        first."""
        if self.stop_requested.is_set():
            logger.warning("second stop request: leaving now; running deliveries come back later")
            self.abandoning.set()
        self.stop_requested.set()
        self._stop_gracefully()

    def _stop_gracefully(self) -> None:
        # When the grace starts: the main thread may notice the stop a look later.
        self._stop_requested_at = self._stop_requested_at or time.monotonic()
        self.stopping.set()
        for consumer in self.consumers:
            consumer.wake()

    def run(self) -> None:
        if self.jitter > 0:
            delay = random.uniform(0, self.jitter)
            logger.info("start-up jitter: waiting %.2f s", delay)
            if self.stopping.wait(delay):
                return
        self._start_database_duties()
        self.pool.start()
        if self.loop_pool is not None:
            self.loop_pool.start()
        for consumer in self.consumers:
            consumer.start()
        while unfinished := [c for c in self.consumers if not c.finished.is_set()]:
            # Signal handlers run during the wait. A burst run ends as soon as its consumers
            # are all done; an idle worker looks each IDLE_LOOK_SECONDS only (its main
            # thread's wake-ups were most of an idle worker's CPU); a stopping one looks
            # each STOPPING_LOOK_SECONDS, for the grace's end and a second signal.
            stopping = self.stopping.is_set()
            unfinished[0].finished.wait(STOPPING_LOOK_SECONDS if stopping else IDLE_LOOK_SECONDS)
            if self.abandoning.is_set():
                break
            if self.outages.gave_up_on is not None and not self.stopping.is_set():
                self._give_up(self.outages.gave_up_on)
            if self.stopping.is_set():
                stop_requested_at = self._stop_requested_at or time.monotonic()
                if time.monotonic() - stop_requested_at > self.grace:
                    self._say_what_the_grace_leaves()
                    self.abandoning.set()
                    break
            elif self.burst and all(c.finished.is_set() for c in self.consumers):
                break
        self.stopping.set()
        for consumer in self.consumers:
            consumer.wake()
            consumer.finished.wait(2.0)
        self.pool.close()
        if self.loop_pool is not None:
            self.loop_pool.close()
        self._stop_database_duties()

    def _say_what_the_grace_leaves(self) -> None:
        """The grace is over and a consumer is not done: handlers still run, or, with none
        running, verdicts wait for a Redis that does not take them."""
        if self._running():
            logger.warning(
                "handlers still running after the %g s grace period; leaving them "
                "to come back through their deadline",
                self.grace,
            )
            return
        logger.warning(
            "verdicts still not committed after the %g s grace period (Redis unreachable "
            "or refusing them); those messages are delivered again after their lease "
            "(MAX_CONSUME_DURATION)",
            self.grace,
        )

    def _give_up(self, address: str) -> None:
        """A burst run that cannot reach Redis: stop as on a first signal (what it fetched
        goes back or comes back after its lease, what can be committed is)."""
        self.gave_up = address
        logger.info("giving up on Redis at %s (--burst): finishing running handlers", address)
        self.request_stop()

    def _start_database_duties(self) -> None:
        relay = self.relay
        if relay is None:
            return
        if self.burst:
            # Everything committed to the outbox by now is due now too: relay it first.
            try:
                relayed = relay.drain()
            except Exception:
                logger.exception("relaying the outbox failed; the burst goes on without it")
            else:
                if relayed:
                    logger.info("relayed %d outbox rows", relayed)
            return
        names = self.exactly_once
        # The relay's thread only starts each round: see prune_rounds.
        every = [(PRUNE_PROCESSED_SECONDS, PruneRounds(names).start)]
        self._database_thread = threading.Thread(
            target=relay.run,
            kwargs={"every": every if names else []},
            name="delayqueue-relay",
            daemon=True,
        )
        self._database_thread.start()

    def _stop_database_duties(self) -> None:
        if self.relay is not None and self._database_thread is not None:
            self.relay.stop()
            self._database_thread.join(timeout=5.0)
