"""One queue's consumer loop: fetch, hand to the pool, flush verdicts, sleep until due.

It runs in its own thread. It fetches the next batch while the handlers still work through
half of the last one, so fast handlers never wait for a round trip. Verdicts from the handler
threads are committed in batches (one round trip per kind, at most VERDICT_FLUSH_SECONDS
after the first of them, or before the next fetch), then the signals are sent, so
``message_acked`` always follows a committed ack. It sleeps until the queue's next due time
(timed on the client, from the Redis clock) or a wake-up, and never gives up because Redis is
away: it logs, backs off and tries again.
"""

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from delayqueue_django.handlers import Handler
from delayqueue_django.message import Message
from delayqueue_django.queue import Queue
from delayqueue_django.timings import Timings
from delayqueue_django.worker import heartbeat, verdicts
from delayqueue_django.worker.backoff import Backoff
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler
from delayqueue_django.worker.wakeup import WakeupListener

if TYPE_CHECKING:
    from delayqueue_django.worker.worker import Worker

logger = logging.getLogger("delayqueue_django.worker")

# Even with nothing due, look again this often, in case a wake-up was lost.
IDLE_RECHECK_SECONDS = 30.0
GARBAGE_EXPIRY_SECONDS = 60.0
# After announcing exhaustions failed, wait this long before claiming again.
ANNOUNCE_RETRY_SECONDS = 1.0
# A verdict waits at most this long to be committed together with the ones that follow it:
# one round trip for many fast handlers, and an ack that is never late by more than this.
VERDICT_FLUSH_SECONDS = 0.005


class QueueConsumer(threading.Thread):
    def __init__(self, worker: "Worker", queue: Queue, handler: Handler) -> None:
        super().__init__(name=f"delayqueue-consumer-{queue.name}", daemon=True)
        self.worker = worker
        self.queue = queue
        self.handler = handler
        self.finished = threading.Event()
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self._first_outcome_at = 0.0  # time.monotonic() of the oldest uncommitted verdict
        self._in_flight = 0
        # A buffered message not started within this many seconds of its fetch goes back.
        self.slack = min(1.0, queue.config.max_consume_ms / 1000 / 10)
        limit = worker.batch_size or queue.config.fetch_batch_size
        self._batch_limit = limit
        # How many messages may be handed to the pool at once: starts at the thread count,
        # grows while handlers are fast enough to start them all well within the slack.
        self._batch = min(limit, worker.concurrency)
        # A moving average of handler durations, for deciding how large batches may grow.
        self._handler_seconds = 0.0
        # Each fetch is a numbered request of this consumer; after a fetch that failed the
        # next one repeats its number, and gets what it took if Redis ran it after all.
        self._fetcher = worker.worker_id
        self._request = 1
        # Redis clock = local monotonic clock + offset (ms), set at every fetch (and a
        # handler only ever runs after one).
        self._clock_offset_ms = 0.0
        self._next_fetch = 0.0
        # Set by wake(); a wake-up that lands while a fetch is under way must not be lost
        # to the sleep time that fetch computes, so it is a flag, not a time.
        self._woken = True
        # True while this consumer waits for a free handler thread (shared by all queues).
        self.starved = False
        self._next_beat = 0.0
        self._next_expiry = 0.0
        self._announce_after = 0.0
        self.listener = WakeupListener(queue, self.wake, worker.stopping)
        # Handler durations and lateness, added to Redis with each heartbeat.
        self.timings = Timings()

    # Called from other threads

    def wake(self) -> None:
        """Look at the queue again now (a wake-up, a free handler, a stop request)."""
        self._woken = True
        self._event.set()

    def report(self, outcome: Outcome) -> None:
        """A handler thread is done with a message: its verdict is committed within
        VERDICT_FLUSH_SECONDS. (The freed thread wakes this consumer separately, through
        the pool, if it was waiting for room to fetch.)"""
        with self._lock:
            self._outcomes.append(outcome)
            waiting = len(self._outcomes)
            if waiting == 1:
                self._first_outcome_at = time.monotonic()
        if waiting == 1 or waiting == self._batch_limit:
            # Only the first verdict wakes the loop, to time the commit; a full batch goes
            # at once. Waking for each one would cost a round trip per message.
            self._event.set()

    def has_room(self) -> bool:
        return self._room() > 0

    def _room(self) -> int:
        """How many messages this consumer may fetch now.

        The pool may hold ``_batch`` messages (running or waiting for a thread), at least
        one per thread. It is refilled once it is down to the threads plus half of what
        may wait: the next batch arrives while the handlers work through the rest.
        """
        concurrency = self.worker.concurrency
        target = max(self._batch, concurrency)
        refill_at = concurrency + (target - concurrency) // 2
        outstanding = self.worker.pool.outstanding()
        if outstanding >= target or outstanding > refill_at:
            return 0
        return target - outstanding

    @property
    def in_flight(self) -> int:
        """Messages fetched whose verdict is not committed yet."""
        with self._lock:
            return self._in_flight

    def is_stale(self, fetched_at: float) -> bool:
        return time.monotonic() - fetched_at > self.slack

    def handle(self, message: Message, *, back_to_back: bool = False) -> Outcome:
        """Run the handler; ``back_to_back`` when this thread ran another message just now."""
        started_ms = self.redis_now_ms()
        outcome = call_handler(self.handler, message, connections_checked=back_to_back)
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
                message.id,
                message.queue,
            )
        return outcome

    def redis_now_ms(self) -> float:
        return time.monotonic() * 1000 + self._clock_offset_ms

    # The loop

    def run(self) -> None:
        try:
            self.listener.start()
            self.listener.subscribed.wait(timeout=2.0)
            self._loop()
        finally:
            self._goodbye()
            self.finished.set()

    def _loop(self) -> None:
        backoff = Backoff()
        while True:
            try:
                self._flush(force=self.worker.stopping.is_set())
                if self.worker.stopping.is_set():
                    self._hand_back(self.worker.pool.take_back(self))
                    if self._idle() or self.worker.abandoning.is_set():
                        return
                    self._wait(0.1)
                    continue
                self._housekeeping()
                wait = self._fetch_if_due()
                backoff.reset()
            except RedisError as error:
                delay = backoff.next()
                logger.warning(
                    "redis unavailable queue=%s: %s; retrying in %.1f s",
                    self.queue.name,
                    error,
                    delay,
                )
                self._wait(delay)
                continue
            except Exception:
                # A bug must not silently end this queue's consumer: log it, back off, go on.
                delay = backoff.next()
                logger.exception(
                    "unexpected error in the consumer loop queue=%s; retrying in %.1f s",
                    self.queue.name,
                    delay,
                )
                self._wait(delay)
                continue
            if wait is None:
                return
            self._wait(wait)

    def _idle(self) -> bool:
        with self._lock:
            return self._in_flight == 0 and not self._outcomes

    def _wait(self, seconds: float) -> None:
        deadline = min(self._next_beat, self._next_expiry)
        with self._lock:
            if self._outcomes:
                deadline = min(deadline, self._first_outcome_at + VERDICT_FLUSH_SECONDS)
        self._event.wait(timeout=max(min(seconds, deadline - time.monotonic()), 0.0))
        self._event.clear()

    def _fetch_if_due(self) -> float | None:
        """Fetch if it is time; returns how long to sleep, or None when a burst run is done."""
        now = time.monotonic()
        if not self._woken and now < self._next_fetch:
            return self._next_fetch - now
        self._woken = False
        # Say so before looking: a thread freed after the look then wakes us.
        self.starved = True
        stale = self._release_stale_buffer()
        if self._room() <= 0:
            # The pool is full enough: a handler thread finishing wakes us.
            return IDLE_RECHECK_SECONDS
        # Commit what is done before fetching more: the quota counts it. The fetch below
        # sees what the commit changed, so the commit need not call for another look.
        self._flush(force=True)
        self._woken = False
        quota = self.worker.quota()
        if quota == 0:
            return IDLE_RECHECK_SECONDS
        self.starved = False
        if not stale and self._batch < self._batch_limit:
            self._grow_batch()
        limit = self._batch_limit if quota is None else min(self._batch_limit, quota)
        # The room, but never more than the batch limit (--batch-size: the room exceeds it
        # when the threads outnumber it) or the quota; at least one, as the room said.
        count = max(min(self._room(), limit), 1)
        fetched = self.queue.fetch(count, fetcher=self._fetcher, request=str(self._request))
        self._request += 1
        store_ms = fetched.now_ms + fetched.now_us / 1000
        self._clock_offset_ms = store_ms - fetched.read_at * 1000
        if fetched.expired:
            logger.info(
                "%d deliveries passed their deadline and were requeued queue=%s",
                fetched.expired,
                self.queue.name,
            )
        if fetched.messages:
            with self._lock:
                self._in_flight += len(fetched.messages)
            self.worker.pool.submit(self, fetched.messages)
        # After the submit: the batch is in hand whatever happens.
        deferred = fetched.exhaustions_owed and not self._announce_exhaustions()
        full = len(fetched.messages) == count
        if fetched.next_ms is None:
            self._next_fetch = now + IDLE_RECHECK_SECONDS
        elif fetched.next_ms <= fetched.now_ms:
            # More is due: fetch again at once while there is room (else a freed thread
            # wakes us).
            self._next_fetch = now if full else now + 0.001
        else:
            # When the Redis clock reaches the due time, by our estimate of it. Waking a hair
            # early costs one more fetch, which waits out what is left by the same reckoning.
            self._next_fetch = (fetched.next_ms - self._clock_offset_ms) / 1000
        if deferred:  # nothing else may be due: come back to announce them
            self._next_fetch = min(self._next_fetch, self._announce_after)
        if self.worker.burst:
            nothing_due = fetched.next_ms is None or fetched.next_ms > fetched.now_ms
            if not fetched.messages and nothing_due and self._idle():
                return None
        # From the clock as it is now: the fetch's round trip has passed since `now`.
        return max(self._next_fetch - time.monotonic(), 0.0)

    def _release_stale_buffer(self) -> bool:
        """Hand back buffered messages that waited past the slack; True if there were any."""
        stale = self.worker.pool.take_back(self, fetched_before=time.monotonic() - self.slack)
        if stale:
            self._shrink_batch()
            self._hand_back(stale)
        return bool(stale)

    def _grow_batch(self) -> None:
        """Double the batch if, at the handlers' usual pace, the last message of a doubled
        batch would still start within half the slack (slow handlers never buffer)."""
        concurrency = self.worker.concurrency
        grown = min(self._batch * 2, self._batch_limit)
        queued_behind = max(grown - concurrency, 0) / concurrency
        if queued_behind * self._handler_seconds < self.slack / 2:
            self._batch = grown

    def _shrink_batch(self) -> None:
        """Handlers are slower than the buffer: fetch about what can start at once."""
        self._batch = max(self.worker.concurrency, self._batch // 2)

    def _hand_back(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        with self._lock:
            self._in_flight -= len(messages)
        self.queue.release(messages)

    def _housekeeping(self) -> None:
        """The heartbeat (with the timings) and garbage expiry, each on its own schedule.

        Neither may hold up deliveries: a failure is logged and tried again at the next
        interval while the loop goes on to fetch. A Redis out of memory refuses the
        heartbeat's writes, yet fetch, ack and nack still run there, and they free memory.
        """
        now = time.monotonic()
        if now >= self._next_beat:
            # Scheduled before trying: a failure waits for the next beat instead of being
            # tried again at once (an overdue beat also cuts every backoff wait to nothing).
            self._next_beat = now + self.worker.heartbeat_interval
            self._unless_failing("heartbeat", self._beat)
        if now >= self._next_expiry:
            self._next_expiry = now + GARBAGE_EXPIRY_SECONDS
            self._unless_failing("garbage expiry", self._expire_garbage)

    def _unless_failing(self, what: str, step: Callable[[], None]) -> None:
        try:
            step()
        except RedisError as error:
            logger.warning(
                "%s failed queue=%s: %s; trying again at the next interval",
                what,
                self.queue.name,
                error,
            )

    def _beat(self) -> None:
        self._add_timings()
        heartbeat.beat(
            self.queue,
            self.worker.worker_id,
            self.worker.details(),
            ttl_seconds=self.worker.heartbeat_interval * 3,
        )

    def _expire_garbage(self) -> None:
        self.queue.prune_throughput()
        expired = self.queue.expire_garbage()
        if expired:
            logger.info(
                "deleted %d dead letters past GARBAGE_RETENTION queue=%s",
                expired,
                self.queue.name,
            )

    def _add_timings(self) -> None:
        increments = self.timings.drain()
        try:
            self.queue.store.add_totals(increments)
        except RedisError:
            self.timings.restore(increments)
            raise

    def _goodbye(self) -> None:
        # If Redis is away, the heartbeat expires on its own (and the last timings are lost).
        with contextlib.suppress(RedisError):
            self._add_timings()
            heartbeat.forget(self.queue, self.worker.worker_id)

    # Verdicts

    def _flush(self, *, force: bool = False) -> None:
        """Commit the handlers' verdicts: all of them when ``force``d, else once the oldest
        has waited VERDICT_FLUSH_SECONDS or a batch is full."""
        with self._lock:
            if not self._outcomes:
                return
            due = self._first_outcome_at + VERDICT_FLUSH_SECONDS
            if not force and len(self._outcomes) < self._batch_limit and time.monotonic() < due:
                return
            outcomes, self._outcomes = self._outcomes, []
        by_verdict: dict[Verdict, list[Outcome]] = {verdict: [] for verdict in Verdict}
        for outcome in outcomes:
            by_verdict[outcome.verdict].append(outcome)
        if by_verdict[Verdict.RELEASE]:
            self._shrink_batch()
        done: list[Outcome] = []
        exhausted = False
        try:
            for verdict in verdicts.COMMIT_ORDER:
                batch = by_verdict[verdict]
                if batch:
                    exhausted |= verdicts.commit(self.queue, verdict, batch)
                    done += batch
        except RedisError:
            # Keep what was not committed, to retry once Redis is back.
            with self._lock:
                self._outcomes[:0] = [o for o in outcomes if o not in done]
            raise
        with self._lock:
            self._in_flight -= len(outcomes)
            idle = self._in_flight == 0
        if idle or len(by_verdict[Verdict.ACK]) < len(outcomes):
            # Retries and hand-backs change what is due, and with nothing left in hand the
            # last fetch's plan is stale too (a burst run ends on the look that finds the
            # queue empty): look again. Acks in the middle of a batch only take work away.
            self._woken = True
        self.worker.count(
            handled=sum(o.verdict is not Verdict.RELEASE for o in outcomes),
            failed=sum(o.verdict in (Verdict.NACK, Verdict.BURY) for o in outcomes),
        )
        if exhausted:
            # After the commit, and never failing it: see _announce_exhaustions.
            self._announce_exhaustions()

    def _announce_exhaustions(self) -> bool:
        """Announce owed exhaustions; False if that has to wait. A failure (Redis away, or
        out of memory: a claim is a write) leaves them owed for a later try, and never fails
        the fetch or the commit that found them."""
        if time.monotonic() < self._announce_after:
            return False
        try:
            verdicts.announce_exhaustions(self.queue)
        except RedisError as error:
            self._announce_after = time.monotonic() + ANNOUNCE_RETRY_SECONDS
            logger.warning(
                "announcing exhausted messages failed queue=%s: %s; trying again in %.0f s",
                self.queue.name,
                error,
                ANNOUNCE_RETRY_SECONDS,
            )
            return False
        return True
