"""What a consumer does between fetches besides fetching: heartbeats and timings, garbage
expiry, the schedules' ticks, and its goodbye."""

import contextlib
import logging
import time

from redis.exceptions import RedisError

from delayqueue_django.schedules.runner.writing import RETRY_MS as SCHEDULES_RETRY_MS
from delayqueue_django.worker import heartbeat
from delayqueue_django.worker.consumer.pool import ConsumerPool

logger = logging.getLogger("delayqueue_django.worker")


GARBAGE_EXPIRY_SECONDS = 60.0


class ConsumerHousekeeping(ConsumerPool):
    """The consumer's periodic chores."""

    # Whether the queue was paused at the last heartbeat (see _note_pause).
    _seen_paused = False

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

    def _beat(self) -> None:
        self.worker.summarize()
        self._add_timings()
        heartbeat.beat(
            self.queue,
            self.worker.worker_id,
            self.worker.details(),
            ttl_seconds=self.worker.heartbeat_interval * 3,
        )
        self._note_pause()

    def _note_pause(self) -> None:
        """Say in the log when the queue was paused or resumed (Queue.pause), as seen at
        each heartbeat: a worker that hands out nothing says why."""
        paused = self.queue.store.flow().paused
        if paused != self._seen_paused:
            self._seen_paused = paused
            if paused:
                logger.warning(
                    "queue is paused: nothing is handed out until it is resumed queue=%s",
                    self.queue.name,
                )
            else:
                logger.info("queue resumed queue=%s", self.queue.name)

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
