"""The outbox relay's lanes: one queue's rows bound for one shard, each failing on its own.

A relay's batch holds rows of many queues (and, for a sharded queue, of many shards), whose
Redis servers fail independently. The lanes' calls go out at once, each in a thread of its
own (``start_call``), and the batch waits for them a bounded time. When one lane's Redis
fails (down, refusing writes, or hung until the socket timeout), only that lane's rows are
held back: they go back to the table in the batch's transaction, the batch commits the
others, and the lane's rows are left out of the relay's reads until the lane answers
again. So one sick Redis costs the healthy lanes one bounded wait, not one per poll.

Whether a held lane answers again is asked in a thread of its own, after a backoff: a
paused master hangs its caller until the socket timeout, and the relay's thread must not
wait for it poll after poll. The outage is logged when it starts and when it ends, not at
each look.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from django.db.models import Q

from delayqueue_django.core.backoff import Backoff
from delayqueue_django.engine.sharding.placement import SHARD_MARK, shard_name, shard_of

logger = logging.getLogger("delayqueue_django.relay")

# (queue name, shard name): the shard an id names ("0" for every unsharded queue's ids).
Lane = tuple[str, str]
T = TypeVar("T")

# How long a held lane waits before its first probe, and at most between two.
FIRST_PROBE_SECONDS = 0.5
PROBE_LIMIT_SECONDS = 10.0


def lane_of(queue: str, message_id: str) -> Lane:
    return queue, shard_name(*shard_of(message_id)) if SHARD_MARK in message_id else "0"


def describe(lane: Lane) -> str:
    queue, shard = lane
    return f"queue {queue!r}" if shard == "0" else f"queue {queue!r} shard {shard}"


def start_call(call: Callable[[], T]) -> "Future[T]":
    """``call`` in a daemon thread of its own: a Redis that hangs holds that thread until
    redis-py gives up (up to about 2 minutes with its retries), never the relay's thread,
    nor the process's exit."""
    future: Future[T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(call())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name="delayqueue-relay-lane", daemon=True).start()
    return future


@dataclass(slots=True)
class _Outage:
    since: float
    error: Exception
    backoff: Backoff = field(
        default_factory=lambda: Backoff(FIRST_PROBE_SECONDS, PROBE_LIMIT_SECONDS)
    )
    retry_at: float = 0.0
    probing: bool = False


class Lanes:
    """The lanes held back, each until a probe of its Redis succeeds."""

    def __init__(self, on_recovered: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._outages: dict[Lane, _Outage] = {}
        self._on_recovered = on_recovered

    def held(self) -> list[Lane]:
        with self._lock:
            return list(self._outages)

    def is_held(self, lane: Lane) -> bool:
        with self._lock:
            return lane in self._outages

    def first_error(self) -> Exception | None:
        with self._lock:
            return next((outage.error for outage in self._outages.values()), None)

    def failed(self, lane: Lane, error: Exception) -> None:
        """Hold ``lane`` back; logged only when its outage begins."""
        now = time.monotonic()
        with self._lock:
            outage = self._outages.get(lane)
            if outage is not None:
                outage.error = error
                return
            outage = self._outages[lane] = _Outage(since=now, error=error)
            outage.retry_at = now + outage.backoff.next()
        logger.warning(
            "outbox relay: %s failed, its rows wait while the other queues' flow: %s",
            describe(lane),
            error,
        )

    def forget_all(self) -> None:
        """Try every lane again (a drain tries each once, whatever the last one found)."""
        with self._lock:
            self._outages.clear()

    def next_probe_at(self) -> float | None:
        with self._lock:
            due = [o.retry_at for o in self._outages.values() if not o.probing]
        return min(due, default=None)

    def probe_due(self, probe: Callable[[Lane], object]) -> None:
        """Start a probe, in a thread of its own, of each held lane whose backoff is over."""
        now = time.monotonic()
        with self._lock:
            due = [
                lane
                for lane, outage in self._outages.items()
                if not outage.probing and outage.retry_at <= now
            ]
            for lane in due:
                self._outages[lane].probing = True
        for lane in due:
            threading.Thread(
                target=self._probe, args=(lane, probe), name="delayqueue-relay-probe", daemon=True
            ).start()

    def _probe(self, lane: Lane, probe: Callable[[Lane], object]) -> None:
        try:
            probe(lane)
        except Exception as error:
            logger.debug("outbox relay: %s still fails: %s", describe(lane), error)
            with self._lock:
                outage = self._outages.get(lane)
                if outage is not None:
                    outage.error = error
                    outage.retry_at = time.monotonic() + outage.backoff.next()
                    outage.probing = False
            return
        with self._lock:
            outage = self._outages.pop(lane, None)
        if outage is not None:
            logger.warning(
                "outbox relay: %s answers again after %.1f s; its rows flow again",
                describe(lane),
                time.monotonic() - outage.since,
            )
            self._on_recovered()

    # Leaving the held lanes' rows out of the relay's reads

    def where(self, quote: Callable[[str], str], queues: Iterable[str]) -> tuple[str, list[str]]:
        """SQL (`` AND ...``, or empty) and its parameters leaving out the rows of the held
        lanes of ``queues``. A shard's rows are those whose id ends with its mark; shard 0's
        those with no mark (an id with a stray "~" is taken, fails and goes back: rare, and
        harmless)."""
        clauses: list[str] = []
        params: list[str] = []
        mine = set(queues)
        for queue, shard in self.held():
            if queue not in mine:
                continue
            if shard == "0":
                clauses.append(f"NOT ({quote('queue')} = %s AND {quote('message_id')} NOT LIKE %s)")
                params += [queue, f"%{SHARD_MARK}%"]
            else:
                clauses.append(f"NOT ({quote('queue')} = %s AND {quote('message_id')} LIKE %s)")
                params += [queue, f"%{SHARD_MARK}{shard}"]
        return "".join(f" AND {clause}" for clause in clauses), params

    def q(self, queues: Iterable[str]) -> Q:
        """The same as ``where``, as a filter of the ORM's."""
        condition = Q()
        mine = set(queues)
        for queue, shard in self.held():
            if queue not in mine:
                continue
            if shard == "0":
                condition &= ~(Q(queue=queue) & ~Q(message_id__contains=SHARD_MARK))
            else:
                condition &= ~(Q(queue=queue) & Q(message_id__endswith=f"{SHARD_MARK}{shard}"))
        return condition
