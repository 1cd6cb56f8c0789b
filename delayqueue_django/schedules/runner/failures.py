"""One schedule's failure, kept its own (see "Each schedule is handled on its own" in
schedules.runner): the step isolated, the schedule passed over with a backoff, logged and
recorded in the store, and its recovery said. Apart, as every step of the runner goes
through it."""

import logging
import math
from collections.abc import Callable
from dataclasses import replace

from redis.exceptions import RedisError

from delayqueue_django.engine.records import ScheduleFailure, loggable
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.runner.state import Failing, RunnerState, _moment

logger = logging.getLogger("delayqueue_django.schedules")

# A schedule that fails is tried again after FAILED_RETRY_MS, then after twice as long each
# time, up to FAILED_RETRY_MAX_MS. It is logged when it starts failing, when the reason
# changes, and every FAILURE_LOG_MS while it goes on (not at every try).
FAILED_RETRY_MS = 5_000
FAILED_RETRY_MAX_MS = 300_000
FAILURE_LOG_MS = 900_000


class RunnerFailures(RunnerState):
    """A schedule's failure: isolated, backed off, logged and recorded."""

    def _isolated(self, name: str, fingerprint: str, now: float, step: Callable[[], None]) -> None:
        """One schedule's step: an error of its own is that schedule's failure, the others
        go on; a Redis error (Redis away, out of memory) is everyone's, and stops the pass."""
        try:
            step()
        except RedisError:
            raise
        except Exception as error:
            self._failed(name, fingerprint, error, now)

    def _failed(self, name: str, fingerprint: str, error: Exception, now: float) -> None:
        """A schedule failed: tried again after a backoff; logged (and recorded in the store,
        for the admin and ``schedules.all()``) as it starts failing, as its reason changes,
        and every FAILURE_LOG_MS while it lasts."""
        reason = _reason(error)
        before = self._failing.get(name)
        if before is None or before.fingerprint != fingerprint:
            before = Failing(fingerprint, reason, int(now), 0, -math.inf)
        tries = before.tries + 1
        backoff = min(FAILED_RETRY_MS * 2 ** min(tries - 1, 16), FAILED_RETRY_MAX_MS)
        failing = replace(before, reason=reason, tries=tries, retry_at_ms=now + backoff)
        self._failing[name] = failing
        if reason != before.reason or now - before.logged_at_ms >= FAILURE_LOG_MS:
            failing.logged_at_ms, failing.reported = now, False
            logger.error(
                "schedule %s of queue %s fails (tried %d time(s) since %s; passed over, tried "
                "again in %d s, while the queue's other schedules go on): %s",
                loggable(name),
                self.queue.name,
                tries,
                _moment(failing.since_ms).isoformat(),
                backoff // 1000,
                loggable(reason),
                exc_info=None if isinstance(error, InvalidSchedule) else error,
            )
        if not failing.reported and fingerprint:
            self.queue.store.report_schedule_failure(
                name, fingerprint, ScheduleFailure(reason, failing.since_ms)
            )
            failing.reported = True

    def _recovered(self, name: str) -> None:
        failing = self._failing.pop(name, None)
        if failing is not None:
            logger.info(
                "schedule %s of queue %s fires again (it failed %d time(s): %s)",
                loggable(name),
                self.queue.name,
                failing.tries,
                loggable(failing.reason),
            )


def _reason(error: Exception) -> str:
    """A failure as the admin shows it: an InvalidSchedule says it all; another error is
    named by its type too (a KeyError's message alone is just the key)."""
    if isinstance(error, InvalidSchedule):
        return str(error)
    return f"{type(error).__name__}: {error}"
