"""A consumer's side of the handler pool: how much it may hand over (room, the batch
grown and shrunk at the handlers' pace), and its running jobs watched between fetches."""

import logging
import math
import time

from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.worker.consumer.state import ConsumerState
from delayqueue_django.worker.pool import Pool, PoolPair, Running

logger = logging.getLogger("delayqueue_django.worker")

# About how many of its last messages a queue whose handler picks per message learns, from
# where they ran, where the next ones will run.
LOOP_SHARE_MESSAGES = 16


class ConsumerPool(ConsumerState):
    """Pacing the batches, and watching this queue's jobs in the pool."""

    def _submit(self, messages: list[Message]) -> None:
        loop = self.worker.loop_pool
        if self.on_loop:
            assert loop is not None
            loop.submit(self, messages)
            return
        router = self._loop_router
        if router is None or loop is None:
            self.worker.pool.submit(self, messages)
            return
        on_loop = [message for message in messages if router(message) is not None]
        self._learn_loop_share(len(on_loop), len(messages))
        if on_loop:
            self._loop_seen = True
            loop.submit(self, on_loop)
        if len(on_loop) < len(messages):
            chosen = {id(message) for message in on_loop}
            self.worker.pool.submit(self, [m for m in messages if id(m) not in chosen])

    def has_room(self) -> bool:
        return self._room() > 0

    def _learn_loop_share(self, on_loop: int, fetched: int) -> None:
        """Follow the share of this queue's messages that run on the loop (a moving average
        over the last LOOP_SHARE_MESSAGES or so): it splits a fetch between the handler
        threads and the loop (see _room)."""
        if fetched:
            kept = (1 - 1 / LOOP_SHARE_MESSAGES) ** fetched
            self._loop_share = self._loop_share * kept + on_loop / fetched * (1 - kept)

    def _paced(self) -> Pool:
        """The pool whose pace the batch follows: the handler threads for a queue whose
        handler picks per message (its loop's room is its concurrency), else its pool."""
        pool = self.pool
        return pool.pools[0] if isinstance(pool, PoolPair) else pool

    def _room(self) -> int:
        """How many messages this consumer may fetch now (see _room_in).

        A queue whose messages run in either pool (the Tasks runner's, once an async task
        came) has no way to know before a fetch where its messages will run: it expects
        them to split as the last ones did, and fetches no more than would fit in either
        pool at that split. Counting the loop's slots for messages that turn out to need a
        thread would fetch a batch for a thread or two that waits past the slack and goes
        back unstarted, fetch after fetch.
        """
        pool = self.pool
        if not isinstance(pool, PoolPair):
            return self._room_in(pool, self._batch)
        threads, loop = pool.pools
        share = self._loop_share
        fits = []
        # Half a message more than each pool's room: a fetch whose expected share for a
        # full pool is under one still goes to the other (a long sync task holding the
        # only thread must not hold back a mostly-async queue's coroutines).
        if share < 1:
            fits.append((self._room_in(threads, self._batch) + 0.5) / (1 - share))
        if share > 0:
            fits.append((self._room_in(loop, loop.concurrency) + 0.5) / share)
        return int(min(fits))

    def _room_in(self, pool: Pool, batch: int) -> int:
        """How many messages this consumer may hand ``pool`` now.

        The pool may hold ``batch`` messages (running or waiting for a thread), at least
        one per thread. It is refilled once it is down to the threads plus half of what
        may wait: the next batch arrives while the handlers work through the rest. While
        one of this queue's handlers has run longer than the slack, nothing is fetched
        ahead: what would wait behind it may well not start in time.

        Every delivery this consumer holds (running, buffered, or handled with its verdict
        not committed: each one an attempt used if the worker dies) counts against the
        target, so they never exceed it.
        """
        concurrency = pool.concurrency
        fullest = max(batch, concurrency)
        outstanding = pool.outstanding()
        # Past the refill point of the largest target, there is no room whatever the
        # handlers' pace: said without listing what runs. (Each handler thread done asks
        # while this consumer waits for room, through most of a fast drain's batch.)
        if outstanding > concurrency + (fullest - concurrency) // 2:
            return 0
        target = concurrency if self._handler_outlasting_slack(pool) else fullest
        refill_at = concurrency + (target - concurrency) // 2
        if outstanding >= target or outstanding > refill_at:
            return 0
        with self._lock:
            uncommitted = len(self._outcomes)
        # A fetch commits the verdicts first, so these are only the handlers that finished
        # since; at least one all the same: the refill is due.
        return max(target - outstanding - uncommitted, 1)

    def _grow_batch(self) -> None:
        """Double the batch if, at the handlers' pace, the last message of a doubled batch
        would still start within half the slack (slow handlers never buffer); never while
        a handler has run longer than the slack."""
        if self._handler_outlasting_slack(self._paced()):
            return
        concurrency = self._paced().concurrency
        grown = min(self._batch * 2, self._batch_limit)
        queued_behind = max(grown - concurrency, 0) / concurrency
        if queued_behind * self._pace() < self.slack / 2:
            self._batch = grown

    def _own_running(self, pool: Pool | None = None) -> list[Running]:
        """This queue's jobs running in ``pool`` (default: wherever its handlers run)."""
        running = (pool or self.pool).running()
        return [each for each in running if each.job.consumer is self]

    def _pace(self) -> float:
        """How long this queue's handlers take, in seconds: the moving average of those that
        returned, or the age of the oldest one still running if that is longer (until a
        handler returns, the average knows nothing of it: a stuck one would count as 0)."""
        running = self._own_running(self._paced())
        oldest = time.monotonic() - running[0].started_at if running else 0.0
        return max(self._handler_seconds, oldest)

    def _handler_outlasting_slack(self, pool: Pool) -> bool:
        running = self._own_running(pool)
        return bool(running) and time.monotonic() - running[0].started_at > self.slack

    def _shrink_batch(self) -> None:
        """Handlers are slower than the buffer: fetch about what can start at once."""
        self._batch = max(self._paced().concurrency, self._batch // 2)

    # This queue's jobs in the pool, between fetches

    def _next_pool_check(self) -> float:
        """When the pool next needs this consumer (time.monotonic(); inf if never): when its
        oldest buffered message outlasts the slack, to hand it back on time, or when one of
        its running handlers passes its delivery's deadline, to report it."""
        at = math.inf
        oldest = self.pool.oldest_buffered(self)
        if oldest is not None:
            at = oldest + self.slack
        for running in self._own_running():
            message = running.job.message
            if (message.id, message.lease) not in self._overruns_reported:
                at = min(at, self._monotonic_at(message.deadline_ms))
        return at

    def _watch_pool(self) -> None:
        """Between fetches (a full pool may keep this consumer from fetching for long): a
        buffered message past the slack calls for a look now, which hands it back long
        before its deadline; a handler running past its deadline is logged, once."""
        oldest = self.pool.oldest_buffered(self)
        if oldest is not None and self.is_stale(oldest):
            self._woken = True  # _fetch_if_due hands back the stale ones, then looks
        self._report_overruns()

    def _report_overruns(self) -> None:
        """Log each of this queue's handlers still running past its delivery's deadline,
        once per delivery: it will never be stopped, and its message is delivered again."""
        running = self._own_running()
        now, redis_now_ms = time.monotonic(), self.redis_now_ms()
        for handler in running:
            message = handler.job.message
            key = (message.id, message.lease)
            if redis_now_ms < message.deadline_ms or key in self._overruns_reported:
                continue
            self._overruns_reported.add(key)
            logger.warning(
                "handler still running past its deadline (MAX_CONSUME_DURATION), for %.1f s "
                "now; message id=%s queue=%s attempt=%s will be delivered again, and this handler "
                "thread stays busy until the handler returns",
                now - handler.started_at,
                loggable(message.id),
                message.queue,
                message.attempt,
            )
        # Only the running ones are remembered: a delivery ends when its handler returns.
        self._overruns_reported &= {(r.job.message.id, r.job.message.lease) for r in running}
