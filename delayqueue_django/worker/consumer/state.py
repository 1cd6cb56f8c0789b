"""What every part of a ``QueueConsumer`` stands on: the worker it asks (``Host``), its
state, and what other threads call on it (a wake-up, a handler's run)."""

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import RedisError

from delayqueue_django.core.handlers import Handler, is_async, loop_router
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.timings import Timings
from delayqueue_django.engine import loggable
from delayqueue_django.engine.errors import is_outage
from delayqueue_django.exceptions import TimeLimitExceeded
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.async_handling import acall_handler
from delayqueue_django.worker.clock import RedisClock
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler
from delayqueue_django.worker.loop_pool import LoopPool
from delayqueue_django.worker.outages import Outages
from delayqueue_django.worker.pool import HandlerPool, Pool, PoolPair
from delayqueue_django.worker.wakeup import WakeupListener

logger = logging.getLogger("delayqueue_django.worker")

# A verdict waits at most this long to be committed together with the ones that follow it:
# one round trip for many fast handlers, and an ack that is never late by more than this.
VERDICT_FLUSH_SECONDS = 0.005


class Host(Protocol):
    """What a consumer asks of the worker that runs it (worker.worker's Worker, which
    builds on the consumers): its options, its shared state and events, the --max-messages
    accounting and the heartbeat's details."""

    @property
    def concurrency(self) -> int: ...
    @property
    def batch_size(self) -> int | None: ...
    @property
    def burst(self) -> bool: ...
    @property
    def heartbeat_interval(self) -> float: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def stopping(self) -> threading.Event: ...
    @property
    def abandoning(self) -> threading.Event: ...
    @property
    def outages(self) -> Outages: ...
    @property
    def pool(self) -> HandlerPool: ...
    @property
    def loop_pool(self) -> LoopPool | None: ...
    @property
    def gave_up(self) -> str | None: ...

    def count(self, *, handled: int, failed: int) -> None: ...

    def count_time_limit_overrun(self) -> None: ...

    def summarize(self) -> None: ...

    def reserve(self, consumer: "ConsumerState", wanted: int) -> int: ...

    def fetched(self, consumer: "ConsumerState") -> None: ...

    def shares_freed(self) -> None: ...

    def details(self) -> dict[str, Any]: ...


class ConsumerState(threading.Thread):
    """A queue's consumer thread: its state, and the calls other threads make on it."""

    def __init__(self, worker: Host, queue: Queue, handler: Handler) -> None:
        super().__init__(name=f"delayqueue-consumer-{queue.name}", daemon=True)
        self.worker = worker
        self.queue = queue
        # The queue's schedules: this worker writes their ticks as they fall due, and skips
        # the missed ones its policy drops (see delayqueue_django.schedules.runner).
        self.schedules = ScheduleRunner(queue, on_news=self._schedules_have_news)
        self.handler = handler
        # An ``async def`` handler runs on the worker's event loop, a sync one in a thread.
        self.on_loop = is_async(handler)
        # A handler that picks per message (the Tasks runner: an async def task runs on the
        # loop); its queue fetches for the loop's slots too once it has sent one there.
        self._loop_router = None if self.on_loop else loop_router(handler)
        self._loop_seen = False
        # Of those, the share of the last messages that ran on the loop (see
        # ConsumerPool._room).
        self._loop_share = 0.0
        self.finished = threading.Event()
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        # time.monotonic() by which the uncommitted verdicts are to be committed
        self._verdicts_due_at = 0.0
        # Verdicts taken for committing, one round trip each, in order; a commit that failed
        # stays first in line (see _send_commits). Only this consumer's thread touches it.
        self._commits: deque[verdicts.Commit] = deque()
        self._commit_requests = itertools.count(1)
        # shard -> when its commits may be tried again, after one failed (sharded queues).
        self._shard_retry_at: dict[str, float] = {}
        # Fetched and not yet committed (handed back, acked, refused): running, buffered,
        # or with its verdict waiting in _outcomes or _commits.
        self._in_flight = 0
        # A buffered message not started within this many seconds of its fetch goes back.
        self.slack = min(1.0, queue.config.max_consume_ms / 1000 / 10)
        limit = worker.batch_size or queue.config.fetch_batch_size
        self._batch_limit = limit
        # How many messages may be handed to the pool at once: starts at the thread count,
        # grows while handlers are fast enough to start them all well within the slack.
        self._batch = min(limit, self.pool.concurrency)
        # A moving average of handler durations, for deciding how large batches may grow.
        self._handler_seconds = 0.0
        # Deliveries (id, lease) whose handler was reported running past their deadline.
        self._overruns_reported: set[tuple[str, int]] = set()
        # Each fetch is a numbered request of this consumer; after a fetch that failed the
        # next one repeats its number, and gets what it took if Redis ran it after all.
        self._fetcher = worker.worker_id
        self._request = 1
        # The Redis clock, learnt from every fetch (and a handler only ever runs after one).
        self._clock = RedisClock()
        self._next_fetch = 0.0
        # Set by wake(); a wake-up that lands while a fetch is under way must not be lost
        # to the sleep time that fetch computes, so it is a flag, not a time.
        self._woken = True
        # The earliest due time (Redis clock, ms) that a wake-up announced for later than
        # now: the loop fetches then, not at once (a fetch now would only learn that time).
        # Cleared just before a fetch, which sees whatever was announced until then.
        self._announced_ms = math.inf
        # The last fetch left work waiting for a slot of MAX_IN_FLIGHT (Fetched.capped): a
        # committed verdict frees one, so it calls for a look at once.
        self._capped = False
        # True while this consumer waits for room in the pool (shared by all queues): a
        # handler thread done, or buffered jobs handed back, wakes it.
        self.starved = False
        self._next_beat = 0.0
        self._next_expiry = 0.0
        # When the schedules next need this consumer, on the Redis clock (ms).
        self._schedules_at_ms = -math.inf
        # The wake-up listener's subscriptions seen: one more is a connection lost and
        # made again (Redis restarted, say), and has the schedules read again (see
        # ScheduleRunner.read_again).
        self._subscriptions_seen = 0
        self._announce_after = 0.0
        self.listener = WakeupListener(queue, self.wake, worker.stopping, worker.outages)
        # Handler durations and lateness, added to Redis with each heartbeat.
        self.timings = Timings()

    @property
    def pool(self) -> Pool:
        """Where this queue's handlers run: the worker's event loop, its handler threads, or
        both (a handler that picks per message, once it has picked the loop)."""
        loop = self.worker.loop_pool
        if self.on_loop:
            assert loop is not None  # the worker makes one for such queues
            return loop
        if self._loop_seen and loop is not None:
            return PoolPair(self.worker.pool, loop)
        return self.worker.pool

    # Called from other threads

    def wake(self, due_ms: int | None = None) -> None:
        """Look at the queue again: now (a free handler, a stop request, a wake-up due now or
        of unknown due time), or at ``due_ms`` on the Redis clock, a wake-up's due time, if
        that is still to come by this consumer's estimate of the Redis clock."""
        if due_ms is not None and due_ms > self.redis_now_ms():
            with self._lock:
                self._announced_ms = min(self._announced_ms, due_ms)
        else:
            self._woken = True
        # Either way the loop times its sleep again.
        self._event.set()

    def look_owed(self) -> bool:
        """Whether this consumer's loop looks at the queue again before it next sleeps: it
        was woken (``_woken``), and the event that ends its sleep is still set (it is
        cleared as a sleep ends, before the look). Waking it again could only cost the
        waker: a handler thread done while the consumer commits and fetches asked, message
        after message, for room it was about to look for anyway."""
        return self._woken and self._event.is_set()

    def report(self, outcome: Outcome) -> None:
        """A handler thread is done with a message: its verdict is committed within
        VERDICT_FLUSH_SECONDS, or at once when it completes what this consumer holds. (The
        freed thread wakes this consumer separately, through the pool, if it was waiting
        for room to fetch.)"""
        with self._lock:
            self._outcomes.append(outcome)
            waiting = len(self._outcomes)
            now = time.monotonic()
            if waiting == 1:
                self._verdicts_due_at = now + VERDICT_FLUSH_SECONDS
            # Every delivery in hand has its verdict (at a trickle, the one message): no
            # other verdict could join them in the wait, which would only delay the ack.
            complete = waiting >= self._in_flight
            if complete:
                self._verdicts_due_at = now
        if waiting == 1 or waiting == self._batch_limit or complete:
            # Only the first verdict wakes the loop, to time the commit; a full batch goes
            # at once, and so do verdicts that nothing else can join. Waking for each one
            # would cost a round trip per message.
            self._event.set()

    @property
    def in_flight(self) -> int:
        """Messages fetched whose verdict is not committed yet."""
        with self._lock:
            return self._in_flight

    def is_stale(self, fetched_at: float) -> bool:
        return time.monotonic() - fetched_at > self.slack

    def handle(self, message: Message, *, back_to_back: bool = False) -> Outcome:
        """Run the sync handler; ``back_to_back`` when this thread ran another message just
        now."""
        started_ms = self.redis_now_ms()
        if self.schedules.declines(message):
            return Outcome(message, Verdict.ACK)
        limit = self.queue.config.time_limit
        outcome = call_handler(
            self.handler, message, connections_checked=back_to_back, time_limit=limit
        )
        if limit is not None and outcome.seconds > limit:
            # With handler threads nothing could stop it (see core.time_limits): told.
            self._ran_past_limit(message, outcome, limit)
        self._handled(message, outcome, started_ms)
        return outcome

    def _ran_past_limit(self, message: Message, outcome: Outcome, limit: float) -> None:
        self.worker.count_time_limit_overrun()
        logger.warning(
            "handler ran %.1f s, past TIME_LIMIT (%g s): message id=%s queue=%s attempt=%s",
            outcome.seconds,
            limit,
            loggable(message.id),
            message.queue,
            message.attempt,
        )

    async def ahandle(self, message: Message) -> Outcome:
        """Await the async handler, on the worker's event loop; its TIME_LIMIT cancels it."""
        started_ms = self.redis_now_ms()
        # A tick's schedule is read from Redis: in a thread, never on the loop (a Redis
        # that stalls would stall every coroutine).
        if self.schedules.may_decline(message) and await asyncio.to_thread(
            self.schedules.declines, message
        ):
            return Outcome(message, Verdict.ACK)
        handler = self.handler
        if not self.on_loop:
            routed = None if self._loop_router is None else self._loop_router(message)
            assert routed is not None  # only what the router sent to the loop comes here
            handler = routed
        limit = self.queue.config.time_limit
        outcome = await acall_handler(handler, message, time_limit=limit)
        if isinstance(outcome.error, TimeLimitExceeded) and outcome.error.__cause__ is not None:
            self.worker.count_time_limit_overrun()
        elif limit is not None and outcome.seconds > limit:
            # Cancelled at the limit, it carried on (or it blocked the loop past it): it
            # could not be stopped, as a handler thread cannot. Told the same way.
            self._ran_past_limit(message, outcome, limit)
        self._handled(message, outcome, started_ms)
        return outcome

    def _handled(self, message: Message, outcome: Outcome, started_ms: float) -> None:
        """Account for a handler's run (timings, pace) and say if it outran its lease."""
        # Both times on the Redis clock; the estimate can land a hair before the due time.
        lateness = max(started_ms - message.due_ms, 0) / 1000 if message.due_ms > 0 else None
        self.timings.observe_delivery(outcome.seconds, lateness)
        # Races between handler threads only blur the average a little.
        self._handler_seconds += (outcome.seconds - self._handler_seconds) / 8
        overrun_ms = self.redis_now_ms() - message.deadline_ms
        if overrun_ms > 0:
            logger.warning(
                "handler overran MAX_CONSUME_DURATION by %d ms; message id=%s queue=%s "
                "may already have been delivered again",
                overrun_ms,
                loggable(message.id),
                message.queue,
            )

    def redis_now_ms(self) -> float:
        return self._clock.now_ms()

    def _monotonic_at(self, redis_ms: float) -> float:
        """A time on the Redis clock, on this process's time.monotonic() clock."""
        return self._clock.monotonic_at(redis_ms)

    def _unless_failing(self, what: str, step: Callable[[], None]) -> None:
        try:
            step()
        except RedisError as error:
            self._failed(f"{what} failed", error, "trying again at the next interval")
        else:
            self.worker.outages.reached(self.queue.address)

    def _failed(self, what: str, error: RedisError, then: str) -> None:
        """Log a step that failed: an outage once for the whole worker (every try at debug
        level), any other error as it comes."""
        level = logging.WARNING
        if is_outage(error):
            self.worker.outages.failed(self.queue.address, error)
            level = logging.DEBUG
        logger.log(level, "%s queue=%s: %s; %s", what, self.queue.name, error, then)

    def _schedules_have_news(self) -> None:
        """A handler thread saw a schedule added, changed or resumed elsewhere: its next
        tick is due to be written now (the housekeeping sees ``has_news``)."""
        self._event.set()
