"""One queue's consumer loop: fetch, hand to the pool, flush verdicts, sleep until due.

It runs in its own thread. It fetches the next batch while the handlers still work through
half of the last one, so fast handlers never wait for a round trip. Verdicts from the handler
threads are committed in batches (one round trip per kind, at most VERDICT_FLUSH_SECONDS
after the first of them, or before the next fetch), then the signals are sent, so
``message_acked`` always follows a committed ack. It sleeps until the queue's next due time
(timed on the client, from the Redis clock) or a wake-up, and never gives up because Redis is
away: it logs, backs off and tries again.

The loop is built from mixins over one state (state: what a consumer holds and its handler
calls), one module each: pool (handing deliveries to the handlers), committing (the
verdicts) and housekeeping (heartbeats, garbage expiry, the schedules' ticks, its goodbye).
Not ``verdicts``: a submodule of that name would take the place of worker.verdicts, which
this module imports under that name (a package's submodules are its attributes).
"""

import logging
import math
import time

from redis.exceptions import RedisError

from delayqueue_django.core.backoff import Backoff
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.consumer.committing import ConsumerVerdicts
from delayqueue_django.worker.consumer.housekeeping import ConsumerHousekeeping
from delayqueue_django.worker.handling import Verdict
from delayqueue_django.worker.wakeup import WakeupListener

logger = logging.getLogger("delayqueue_django.worker")


# Even with nothing due, look again this often, in case a wake-up was lost.
IDLE_RECHECK_SECONDS = 30.0
# While the wake-up listener is not subscribed (Redis away, a dead connection being
# replaced), wake-ups go unheard: look at least this often instead.
UNHEARD_WAKEUPS_RECHECK_SECONDS = 1.0


class QueueConsumer(ConsumerVerdicts, ConsumerHousekeeping):
    """One queue's consumer thread: its loop, over its parts (state, pool, verdicts,
    housekeeping)."""

    # The loop

    def run(self) -> None:
        verdicts.await_receivers_on(self.worker.loop_pool)
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
                    self._hand_back(self.pool.take_back(self))
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
        self._capped = fetched.capped
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
            self._submit(fetched.messages)
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
        stale = self.pool.take_back(self, fetched_before=time.monotonic() - self.slack)
        if stale:
            self._shrink_batch()
            self._hand_back(stale)
        return bool(stale)
