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
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from redis.exceptions import RedisError

from delayqueue_django.core.backoff import Backoff
from delayqueue_django.core.handlers import Handler
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.timings import Timings
from delayqueue_django.engine import loggable
from delayqueue_django.engine.errors import is_outage, timed_out
from delayqueue_django.engine.shard_layouts import SHARD_RETRY_SECONDS
from delayqueue_django.engine.sharded_store import ShardedStore
from delayqueue_django.schedules.runner import RETRY_MS as SCHEDULES_RETRY_MS
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.worker import heartbeat, verdicts
from delayqueue_django.worker.clock import RedisClock
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler
from delayqueue_django.worker.outages import Outages
from delayqueue_django.worker.pool import HandlerPool, Running
from delayqueue_django.worker.wakeup import WakeupListener

logger = logging.getLogger("delayqueue_django.worker")

# Even with nothing due, look again this often, in case a wake-up was lost.
IDLE_RECHECK_SECONDS = 30.0
# While the wake-up listener is not subscribed (Redis away, a dead connection being
# replaced), wake-ups go unheard: look at least this often instead.
UNHEARD_WAKEUPS_RECHECK_SECONDS = 1.0
GARBAGE_EXPIRY_SECONDS = 60.0
# After announcing exhaustions failed, wait this long before claiming again.
ANNOUNCE_RETRY_SECONDS = 1.0
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
    def gave_up(self) -> str | None: ...

    def count(self, *, handled: int, failed: int) -> None: ...

    def summarize(self) -> None: ...

    def reserve(self, consumer: "QueueConsumer", wanted: int) -> int: ...

    def fetched(self, consumer: "QueueConsumer") -> None: ...

    def shares_freed(self) -> None: ...

    def details(self) -> dict[str, Any]: ...


class QueueConsumer(threading.Thread):
    def __init__(self, worker: Host, queue: Queue, handler: Handler) -> None:
        super().__init__(name=f"delayqueue-consumer-{queue.name}", daemon=True)
        self.worker = worker
        self.queue = queue
        # The queue's schedules: this worker writes their ticks as they fall due, and skips
        # the missed ones its policy drops (see delayqueue_django.schedules.runner).
        self.schedules = ScheduleRunner(queue, on_news=self._schedules_have_news)
        self.handler = self.schedules.guard(handler)
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
        self._batch = min(limit, worker.concurrency)
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

    def has_room(self) -> bool:
        return self._room() > 0

    def _room(self) -> int:
        """How many messages this consumer may fetch now.

        The pool may hold ``_batch`` messages (running or waiting for a thread), at least
        one per thread. It is refilled once it is down to the threads plus half of what
        may wait: the next batch arrives while the handlers work through the rest. While
        one of this queue's handlers has run longer than the slack, nothing is fetched
        ahead: what would wait behind it may well not start in time.

        Every delivery this consumer holds (running, buffered, or handled with its verdict
        not committed: each one an attempt used if the worker dies) counts against the
        target, so they never exceed it.
        """
        concurrency = self.worker.concurrency
        target = concurrency if self._handler_outlasting_slack() else max(self._batch, concurrency)
        refill_at = concurrency + (target - concurrency) // 2
        outstanding = self.worker.pool.outstanding()
        if outstanding >= target or outstanding > refill_at:
            return 0
        with self._lock:
            uncommitted = len(self._outcomes)
        # A fetch commits the verdicts first, so these are only the handlers that finished
        # since; at least one all the same: the refill is due.
        return max(target - outstanding - uncommitted, 1)

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
                loggable(message.id),
                message.queue,
            )
        return outcome

    def redis_now_ms(self) -> float:
        return self._clock.now_ms()

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
                    if (
                        self._idle()
                        or self.worker.abandoning.is_set()
                        or self._gave_up_holding_only_verdicts()  # held for failed shards
                    ):
                        return
                    self._wait(0.1)
                    continue
                self._housekeeping()
                wait = self._fetch_if_due()
                backoff.reset()
            except RedisError as error:
                if self._gave_up_holding_only_verdicts():  # a commit failed
                    return
                # Whatever failed (a fetch over a connection that just went dead, say), the
                # look this turn owed is still owed: retried after the backoff, on a fresh
                # connection (redis-py drops one that failed), not at the old plan.
                self._woken = True
                delay = backoff.next()
                self._failed("redis unavailable", error, f"retrying in {delay:.1f} s")
                self._wait(delay, backing_off=True)
                continue
            except BaseException:
                # A bug must not silently end this queue's consumer, nor a SystemExit from
                # code it calls (the worker stops through its own events, never through an
                # exception here): log it, back off, go on.
                self._woken = True
                delay = backoff.next()
                logger.exception(
                    "unexpected error in the consumer loop queue=%s; retrying in %.1f s",
                    self.queue.name,
                    delay,
                )
                self._wait(delay, backing_off=True)
                continue
            if wait is None:
                return
            self._wait(min(wait, self._unless_wakeups_go_unheard()))

    def _unless_wakeups_go_unheard(self) -> float:
        """How long the loop may sleep as far as wake-ups go: any time while the listener is
        subscribed; else briefly, with a look planned at the end of it (and a listener
        thread that ended somehow is replaced)."""
        if not self.listener.is_alive() and not self.worker.stopping.is_set():
            logger.warning("wake-up listener stopped queue=%s; starting a new one", self.queue.name)
            self.listener = WakeupListener(
                self.queue, self.wake, self.worker.stopping, self.worker.outages
            )
            self.listener.start()
            self._subscriptions_seen = 0
            self.schedules.read_again()
        self._read_schedules_if_resubscribed()
        if self.listener.subscribed.is_set():
            return math.inf
        self._next_fetch = min(self._next_fetch, time.monotonic() + UNHEARD_WAKEUPS_RECHECK_SECONDS)
        return UNHEARD_WAKEUPS_RECHECK_SECONDS

    def _read_schedules_if_resubscribed(self) -> None:
        """The listener subscribed again since the last look: Redis answers again after
        the connection was lost (a restart, a failover), maybe without its data. Counted,
        not sampled: a subscription lost and made again between two looks is not missed."""
        subscriptions = self.listener.subscriptions
        if subscriptions > self._subscriptions_seen:
            if self._subscriptions_seen > 0:
                self.schedules.read_again()
            self._subscriptions_seen = subscriptions

    def _idle(self) -> bool:
        with self._lock:
            return self._in_flight == 0 and not self._outcomes

    def _gave_up_holding_only_verdicts(self) -> bool:
        """Whether this consumer is done, though Redis did not take what it holds: the burst
        run gave up on Redis, and all it holds are verdicts and hand-backs whose commit
        failed (those left in line after a flush), no handler of its queue running or
        waiting to run, no verdict not tried yet. The grace is for such handlers; retrying
        the commits through it would not bring Redis back. Those deliveries come back after
        their lease, as a killed worker's do."""
        if self.worker.gave_up is None or not self.worker.stopping.is_set():
            return False
        with self._lock:
            held = [outcome for commit in self._commits for outcome in commit.outcomes]
            if self._outcomes or len(held) < self._in_flight:
                return False
        handed_back = sum(outcome.verdict is Verdict.RELEASE for outcome in held)
        said = [
            f"{count} {what}{'' if count == 1 else 's'}"
            for count, what in ((len(held) - handed_back, "verdict"), (handed_back, "hand-back"))
            if count
        ]
        if said:
            logger.warning(
                "could not commit %s queue=%s: Redis unreachable; those messages are delivered "
                "again after their lease (MAX_CONSUME_DURATION)",
                " and ".join(said),
                self.queue.name,
            )
        return True

    def _wait(self, seconds: float, *, backing_off: bool = False) -> None:
        deadline = math.inf
        # The housekeeping's schedules; a stopping consumer keeps none of them, and once one
        # passed it would end every wait at once (a busy loop all through the grace period).
        if not self.worker.stopping.is_set():
            schedules = [
                self._next_beat,
                self._next_expiry,
                self._next_pool_check(),
                self._monotonic_at(self._schedules_at_ms),
            ]
            if backing_off:
                # After a failure only times still to come: one passed is the next turn's
                # to keep, and that turn may fail before its housekeeping (a commit that
                # fails again comes first), so a passed one would end every backoff at
                # once: a busy loop for as long as Redis is away.
                now = time.monotonic()
                schedules = [at for at in schedules if at > now]
            deadline = min(schedules, default=math.inf)
        if self._commits and self._shard_retry_at:
            # Commits held back for a shard that failed: tried again at its retry time
            # (the next flush), not at whatever next wakes an idle loop. (Only times still
            # to come: one passed is the next flush's to try, and must not cut a backoff.)
            now = time.monotonic()
            shards = {commit.shard for commit in self._commits}
            retries = [at for shard, at in self._shard_retry_at.items() if shard in shards]
            deadline = min([deadline, *(at for at in retries if at > now)])
        with self._lock:
            if self._outcomes:
                deadline = min(deadline, self._verdicts_due_at)
        self._event.wait(timeout=max(min(seconds, deadline - time.monotonic()), 0.0))
        self._event.clear()

    def _fetch_if_due(self) -> float | None:
        """Fetch if it is time; returns how long to sleep, or None when a burst run is done."""
        now = time.monotonic()
        with self._lock:
            announced_ms = self._announced_ms
        next_fetch = min(self._next_fetch, self._monotonic_at(announced_ms))
        if not self._woken and now < next_fetch:
            return next_fetch - now
        self._woken = False
        # Say so before looking: room freed after the look then wakes us.
        self.starved = True
        stale = self._release_stale_buffer()
        if self._room() <= 0:
            # The pool is full enough: a handler thread finishing, or a hand-back (of any
            # queue's buffered jobs), wakes us.
            return IDLE_RECHECK_SECONDS
        # Commit what is done before fetching more: the quota counts it. The fetch below
        # sees what the commit changed, so the commit need not call for another look.
        self._flush(force=True)
        self._woken = False
        if not stale and self._batch < self._batch_limit:
            self._grow_batch()
        # The room, but never more than the batch limit (--batch-size: the room exceeds it
        # when the threads outnumber it); at least one, as the room said; under
        # --max-messages, no more than what is left, reserved for this fetch.
        count = self.worker.reserve(self, max(min(self._room(), self._batch_limit), 1))
        if count == 0:
            return IDLE_RECHECK_SECONDS  # still starved: a share set free wakes us
        self.starved = False
        with self._lock:
            # This fetch sees every message announced so far; later announcements stay.
            self._announced_ms = math.inf
        fetched = self.queue.fetch(count, fetcher=self._fetcher, request=str(self._request))
        self.worker.outages.reached(self.queue.address)
        self._request += 1
        store_ms = fetched.now_ms + fetched.now_us / 1000
        self._clock.learn(store_ms, fetched.read_at, fetched.read_within)
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
        self.worker.fetched(self)
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
            # Never later than the idle re-check, as with nothing due: a wake-up lost must
            # not wait for a message due hours from now.
            self._next_fetch = min(self._monotonic_at(fetched.next_ms), now + IDLE_RECHECK_SECONDS)
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
        """Double the batch if, at the handlers' pace, the last message of a doubled batch
        would still start within half the slack (slow handlers never buffer); never while
        a handler has run longer than the slack."""
        if self._handler_outlasting_slack():
            return
        concurrency = self.worker.concurrency
        grown = min(self._batch * 2, self._batch_limit)
        queued_behind = max(grown - concurrency, 0) / concurrency
        if queued_behind * self._pace() < self.slack / 2:
            self._batch = grown

    def _own_running(self) -> list[Running]:
        return [running for running in self.worker.pool.running() if running.job.consumer is self]

    def _pace(self) -> float:
        """How long this queue's handlers take, in seconds: the moving average of those that
        returned, or the age of the oldest one still running if that is longer (until a
        handler returns, the average knows nothing of it: a stuck one would count as 0)."""
        running = self._own_running()
        oldest = time.monotonic() - running[0].started_at if running else 0.0
        return max(self._handler_seconds, oldest)

    def _handler_outlasting_slack(self) -> bool:
        running = self._own_running()
        return bool(running) and time.monotonic() - running[0].started_at > self.slack

    def _shrink_batch(self) -> None:
        """Handlers are slower than the buffer: fetch about what can start at once."""
        self._batch = max(self.worker.concurrency, self._batch // 2)

    def _hand_back(self, messages: Sequence[Message]) -> None:
        """Release buffered messages that never started, ahead of any verdict waiting to be
        committed. If Redis does not answer, they wait in line to be released when it does
        (a failure raises, for the loop to back off), rather than time out using an
        attempt; they count as in flight until then."""
        if not messages:
            return
        outcomes = [Outcome(message, Verdict.RELEASE) for message in messages]
        for shard, part in reversed(verdicts.by_shard(outcomes).items()):
            self._commits.appendleft(verdicts.Commit(Verdict.RELEASE, part, shard=shard))
        self._send_commits()

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
        if self.redis_now_ms() >= self._schedules_at_ms or self.schedules.has_news():
            self._unless_failing("schedules", self._run_schedules)
        self._watch_pool()

    # This queue's jobs in the pool, between fetches

    def _next_pool_check(self) -> float:
        """When the pool next needs this consumer (time.monotonic(); inf if never): when its
        oldest buffered message outlasts the slack, to hand it back on time, or when one of
        its running handlers passes its delivery's deadline, to report it."""
        at = math.inf
        oldest = self.worker.pool.oldest_buffered(self)
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
        oldest = self.worker.pool.oldest_buffered(self)
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

    def _beat(self) -> None:
        self.worker.summarize()
        self._add_timings()
        heartbeat.beat(
            self.queue,
            self.worker.worker_id,
            self.worker.details(),
            ttl_seconds=self.worker.heartbeat_interval * 3,
        )

    def _schedules_have_news(self) -> None:
        """A handler thread saw a schedule added, changed or resumed elsewhere: its next
        tick is due to be written now (the housekeeping sees ``has_news``)."""
        self._event.set()

    def _run_schedules(self) -> None:
        # Planned before trying, as the heartbeat is: a failure waits before the next try.
        self._schedules_at_ms = self.redis_now_ms() + SCHEDULES_RETRY_MS
        self._schedules_at_ms = self.schedules.run_due(self.redis_now_ms())

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
        has waited VERDICT_FLUSH_SECONDS or a batch is full; commits that failed before go
        first, and at once."""
        with self._lock:
            outcomes: list[Outcome] = []
            if self._outcomes:
                due = self._verdicts_due_at
                if (
                    force
                    or self._commits
                    or len(self._outcomes) >= self._batch_limit
                    or time.monotonic() >= due
                ):
                    outcomes, self._outcomes = self._outcomes, []
        if outcomes:
            self._line_up(outcomes)
        self._send_commits()

    def _line_up(self, outcomes: list[Outcome]) -> None:
        """Queue outcomes for committing: one commit per verdict, each its own request."""
        by_verdict: dict[Verdict, list[Outcome]] = {verdict: [] for verdict in Verdict}
        for outcome in outcomes:
            by_verdict[outcome.verdict].append(outcome)
        if by_verdict[Verdict.RELEASE]:
            self._shrink_batch()
        for verdict in verdicts.COMMIT_ORDER:
            for shard, part in verdicts.by_shard(by_verdict[verdict]).items():
                request = str(next(self._commit_requests))
                self._commits.append(verdicts.Commit(verdict, part, request, shard))

    def _send_commits(self) -> None:
        """Send the queued commits in order. One that raises stays first in line, to be sent
        again as it was by the next flush (after the loop's backoff): the same request, so
        that if Redis ran it and only the reply was lost, the repeat is told what it did.
        Those committed before it are counted and signalled all the same, once.

        On a queue of many shards, a commit to a shard that cannot be reached stays in line
        with the rest of its shard's, tried again after SHARD_RETRY_SECONDS, while the other
        shards' go on: a master down holds up only its own messages (its fetches are left
        out the same way, see engine.shard_fetch)."""
        committed: list[Outcome] = []
        exhausted = False
        now = time.monotonic()
        held = {shard for shard, at in self._shard_retry_at.items() if at > now}
        waiting: list[verdicts.Commit] = []
        try:
            while self._commits:
                commit = self._commits[0]
                if commit.shard in held:
                    waiting.append(self._commits.popleft())
                    continue
                try:
                    exhausted |= verdicts.commit(
                        self.queue,
                        commit.verdict,
                        commit.outcomes,
                        fetcher=self._fetcher,
                        request=commit.request,
                    )
                except Exception as error:
                    # One shard's failure, whether its master is away or refuses (a full
                    # disk's MISCONF, say), holds up its own commits only, as fetches
                    # pass over it.
                    if not (isinstance(error, RedisError | OSError) and self._spread()):
                        raise
                    first = commit.shard not in self._shard_retry_at
                    self._shard_retry_at[commit.shard] = now + SHARD_RETRY_SECONDS
                    held.add(commit.shard)
                    waiting.append(self._commits.popleft())
                    if timed_out(error):
                        # Its server did not answer in time: the commits to its other
                        # shards would each wait out a timeout too.
                        self._hold_siblings(commit.shard, now, held)
                    # A refusal is news for whoever runs Redis (once, at its first failure);
                    # an outage is said by the fetches and the outage log.
                    logger.log(
                        logging.WARNING if first and not is_outage(error) else logging.DEBUG,
                        "commit to shard %s failed queue=%s: %s; its verdicts wait, trying "
                        "again every %g s",
                        commit.shard,
                        self.queue.name,
                        error,
                        SHARD_RETRY_SECONDS,
                    )
                    continue
                self._commits.popleft()
                self._shard_retry_at.pop(commit.shard, None)
                committed += commit.outcomes
        finally:
            # In their order, ahead of any that raised: each shard's stay in order.
            self._commits.extendleft(reversed(waiting))
            if committed:
                self._settle(committed, exhausted=exhausted)

    def _hold_siblings(self, shard: str, now: float, held: set[str]) -> None:
        store = self.queue.store
        assert isinstance(store, ShardedStore)  # only a spread queue holds commits
        queued = {commit.shard for commit in self._commits}
        for sibling in store.hold_siblings(shard):
            if sibling in queued:
                self._shard_retry_at[sibling] = now + SHARD_RETRY_SECONDS
                held.add(sibling)

    def _spread(self) -> bool:
        """Whether this queue reads more than one shard."""
        store = self.queue.store
        return isinstance(store, ShardedStore) and store.shard_count > 1

    def _settle(self, committed: list[Outcome], *, exhausted: bool) -> None:
        """Account for committed outcomes: counted, no longer in flight, exhaustions owed."""
        # Counted first: between the two, a consumer reserving its share of --max-messages
        # would otherwise see them neither handled nor in flight, and count on them again.
        self.worker.count(
            handled=sum(o.verdict is not Verdict.RELEASE for o in committed),
            failed=sum(o.verdict in (Verdict.NACK, Verdict.BURY) for o in committed),
        )
        with self._lock:
            self._in_flight -= len(committed)
            idle = self._in_flight == 0
        if any(outcome.verdict is Verdict.RELEASE for outcome in committed):
            self.worker.shares_freed()
        if any(outcome.verdict is not Verdict.ACK for outcome in committed) or (
            idle and self.worker.burst
        ):
            # Retries and hand-backs change what is due: look again; so does a burst run
            # with nothing left in hand, which ends on the look that finds the queue empty.
            # Acks only take work away: the last fetch's plan stands (a message sent since,
            # due earlier, announced itself), so at a trickle an ack costs no extra fetch.
            self._woken = True
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
            self._failed(
                "announcing exhausted messages failed",
                error,
                f"trying again in {ANNOUNCE_RETRY_SECONDS:.0f} s",
            )
            return False
        return True
