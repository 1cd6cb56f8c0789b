"""Saying when a worker loses Redis and when it has it back.

Every thread of a worker meets an outage on its own (each consumer's fetches, heartbeats and
housekeeping, each wake-up listener), each retrying on its own backoff; a line from each
try would bury the news. So the worker says it once per server: one warning when a server
stops answering, a reminder every REMIND_SECONDS while it stays away, and one line when it
answers again. Each try is still logged, at debug level (``-v 2``).

A burst run also gives up on a server it has not reached for ``give_up_after`` seconds: the
outage is noted in ``gave_up_on`` (instead of a reminder saying it retries), and the worker
stops.
"""

import logging
import math
import threading
import time
from dataclasses import dataclass

from delayqueue_django.engine.errors import QueueUnavailable

logger = logging.getLogger("delayqueue_django.worker")

REMIND_SECONDS = 60.0


# A failure this soon after the server answered again may be a straggler: a call that began
# before it came back (each thread retries on its own, and a timed-out call ends up to a
# socket timeout later). It is said only if failures go on past this.
SETTLE_SECONDS = 5.0


@dataclass
class _Outage:
    since: float  # time.monotonic()
    said_at: float | None  # None: not said yet (it began while the server was settling)


class Outages:
    """The servers (by address) a worker cannot reach now; shared by all its threads."""

    def __init__(self, *, give_up_after: float | None = None) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, _Outage] = {}
        # When each server that had been away answered again (time.monotonic()).
        self._back_at: dict[str, float] = {}
        # None: never give up (a worker run until stopped).
        self.give_up_after = give_up_after
        # The first server that failed give_up_after seconds after its outage began.
        self.gave_up_on: str | None = None

    def failed(self, address: str, error: BaseException) -> None:
        """A call to the server at ``address`` failed with ``is_outage(error)``."""
        if isinstance(error, QueueUnavailable) and error.__cause__ is not None:
            error = error.__cause__  # redis-py's words: the queue's would repeat the address
        now = time.monotonic()
        settled = now - self._back_at.get(address, -math.inf) >= SETTLE_SECONDS
        with self._lock:
            outage = self._down.get(address)
            if outage is None:
                outage = self._down[address] = _Outage(since=now, said_at=None)
            if self._unbearable(address, outage, now):
                return  # the worker stops, and says why: no "retrying" now
            if outage.said_at is None:
                if not settled:
                    return
                outage.said_at = now
                begins = True
            elif now - outage.said_at >= REMIND_SECONDS:
                outage.said_at = now
                begins = False
            else:
                return
        if begins:
            logger.warning("cannot reach Redis at %s, retrying: %s", address, error)
        else:
            logger.warning(
                "still cannot reach Redis at %s after %.0f s, retrying: %s",
                address,
                now - outage.since,
                error,
            )

    def _unbearable(self, address: str, outage: _Outage, now: float) -> bool:
        """Whether this failure, ``now``, ends the wait for the server (``give_up_after``
        seconds after the outage's first failure: a failure proves the server still away,
        where the time alone would not, the next try may well reach it)."""
        if self.give_up_after is None or now - outage.since < self.give_up_after:
            return False
        if self.gave_up_on is None:
            self.gave_up_on = address
        return True

    def reached(self, address: str) -> None:
        """A call to the server at ``address`` succeeded."""
        if address not in self._down:  # the usual case, decided without the lock
            return
        with self._lock:
            outage = self._down.pop(address, None)
            if outage is not None:
                self._back_at[address] = time.monotonic()
        if outage is not None and outage.said_at is not None:
            # At the outage's own level: whoever saw it begin sees it end.
            logger.warning(
                "connected to Redis at %s again, after %.1f s",
                address,
                time.monotonic() - outage.since,
            )
