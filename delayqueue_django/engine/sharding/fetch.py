"""Fetching from a ``ShardedStore``: the plan of when each shard next has work.

Fetching keeps a plan: when each shard next has work, learned from that shard's fetches
and, while a wake-up subscription of this store listens (a worker's), its wake-ups. A
fetch takes from the shards that are due by the plan, in turn from where the last one
stopped (each process starts at a random shard), until it has ``count``; with no one
listening (the plan would miss what other processes send), it looks at every shard in
turn, and with none due (a look in case a wake-up was lost) at up to IDLE_LOOK_SHARDS;
while some are due, one not asked for LOOK_AGAIN_SECONDS joins each fetch, so a lost
wake-up delays its shard by that much at most, however busy the others stay. A
shard whose Redis cannot be reached is left out and tried again every
SHARD_RETRY_SECONDS while the others keep flowing; a fetch whose shards all failed asks
the others, and raises only when none answers. A shard is waited for
FETCH_PATIENCE_SECONDS at the most: one whose server does not answer by then (or times
out) has that server's shards left out of every fetch until a probe of it answers
(engine.sharding.hangs), so the deliveries a fetch took from the others never wait for a
socket timeout, and no later fetch waits on that server while it stays hung.

Clocks: each shard's scripts judge what is due by its own server's clock, so nothing is
ever handed out early. The plan takes the shards' clocks for one (on one server they are;
a Redis Cluster's masters agree to within what NTP keeps them): a master whose clock runs
ahead of the others by some milliseconds has its shards' messages fetched up to that much
late, one behind by as much early, which its script answers with the due time again.

The fetch is here, with the flow gates' reservation around it; what the plan learns is
kept by engine.sharding.planning, a hung server's shards are held and probed by
engine.sharding.holding, and the exhausted messages are claimed by engine.sharding.claims.
"""

import logging
import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace

from redis.exceptions import RedisError

from delayqueue_django.engine.errors import QueueTimedOut, timed_out
from delayqueue_django.engine.flow import GATES_RESERVED, GATES_SHARD, Reservation
from delayqueue_django.engine.records import Delivery, FetchResult
from delayqueue_django.engine.sharding.claims import ShardClaims
from delayqueue_django.engine.sharding.hangs import FETCH_PATIENCE_SECONDS
from delayqueue_django.engine.sharding.holding import ShardHolding
from delayqueue_django.engine.sharding.plan import ShardPlan
from delayqueue_django.engine.sharding.planning import ShardPlanning

logger = logging.getLogger("delayqueue_django.engine")

# A shard the plan has due within this long of a fetch is fetched from: the consumer times
# its sleep by the same clock readings, to well under this.
DUE_SLACK_SECONDS = 0.001
# At most this many shards are asked by a fetch when none is due by the plan.
IDLE_LOOK_SHARDS = 30
# A shard not asked for this long joins a fetch even while others are due (one a fetch):
# a wake-up lost on its way (pub/sub delivers at most once) leaves its plan saying it is
# empty, and a later send there publishes nothing behind its older head. The consumer's
# idle look (worker.consumer.IDLE_RECHECK_SECONDS) covers a queue with nothing due.
LOOK_AGAIN_SECONDS = 30.0
# A fetch held back by the flow gates with no time to look again (paused) looks again
# within this long (ms), as a fetch of one shard does (flow_gate in the prelude).
LOOK_AGAIN_MS = 1000


class ShardFetching(ShardPlanning, ShardHolding, ShardClaims):
    """The part of a ``ShardedStore`` that fetches: the plan, kept from fetches and
    wake-ups, of which shards to ask."""

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        self.refresh_layouts()
        if len(self._order) == 1:
            # One shard (SHARDS 1, nothing to drain): the plan would only echo its reply.
            return self.base.fetch(count, fetcher=fetcher, request=request)
        self._probe_hung(time.monotonic())
        visits, repeating, idle = self._visits(time.monotonic(), fetcher, request)
        # The flow gates: the whole queue's budget is reserved on shard 0 first (see
        # engine.flow), unless no shard is due (an idle look takes nothing) or the fetch
        # repeats one (its shards are asked for none: those with a record of it hand out
        # again what they took, whatever the count, and the settling counts that).
        budgeted = self._budgeted()
        gates = GATES_RESERVED if budgeted else GATES_SHARD
        reservation, entries, wanted, leased_from = None, "", count, None
        if budgeted:
            # (A request is named within its fetcher's; a fetch without one, by a uuid.)
            entries = f"{fetcher}:{request}" if request else uuid.uuid4().hex
        if budgeted and (idle or repeating):
            count = 0
        elif budgeted:
            reservation = self.base.reserve(count, entries)
            if reservation.rate is None and self.limits.rate_limit is None:
                self._run_time_rate = False
            if reservation.granted == 0:
                return self._held_back(reservation, visits, fetcher, request, entries)
            # The leases run from the reservation: a delivery's hand-out time is its entry's.
            count, leased_from = reservation.granted, reservation.now_ms
        # Whether the gates, not the work, bound what the shards are asked for: a shard
        # handing out all it was asked then wakes no idle peer (the rest waits for them).
        gated = budgeted and count < wanted
        taken: list[tuple[str, FetchResult]] = []
        asked: list[str] = []
        failures: list[Exception] = []
        held_back: set[str] = set()
        # How many of the reservation the shards that failed were asked for: they may have
        # handed them out (their reply lost after their script ran).
        lost = 0

        def ask(names: Iterable[str], *, to_the_end: bool) -> None:
            """Fetch from each shard in turn until ``count`` (or from every one, if told),
            but for those held back meanwhile (a shard on their server timed out)."""
            nonlocal lost
            remaining = count - lost - sum(len(result.deliveries) for _, result in taken)
            for name in names:
                # (With all of it lost to shards that failed, one more is asked, for none:
                # the fetch answers, with the clock, rather than fail for one shard.)
                if remaining <= 0 < count and not to_the_end and taken:
                    return
                if not to_the_end and name in held_back:
                    continue
                asked.append(name)
                # (A fetch of none still has each shard it asks retry what expired.) Under
                # a reservation, a shard that failed last time is asked for none until it
                # answers again: each failure holds what it was asked for (see below).
                share = max(remaining, 0)
                if reservation is not None and self._failing(name):
                    share = 0
                result = self._fetch_shard(
                    name, share, fetcher, request, gates, leased_from, failures, gated
                )
                if result is not None:
                    taken.append((name, result))
                    remaining -= len(result.deliveries)
                elif timed_out(failures[-1]):
                    held_back.update(self.hold_siblings(name))
                if result is None and reservation is not None:
                    # It may have handed its share out: not given back, nor asked of others.
                    lost += share
                    remaining -= share

        ask(visits, to_the_end=repeating)
        if not taken and not repeating:
            # Every shard asked failed: ask the others that are not failing, so that one
            # master down never holds up the rest (nor leaves this fetch without a clock).
            now = time.monotonic()
            with self._lock:
                others = [
                    name
                    for name in self._order
                    if name not in asked
                    and not self._plans[name].held
                    and self._plans[name].retry_at <= now
                ]
            ask(others, to_the_end=False)
        handed = [delivery for _, result in taken for delivery in result.deliveries]
        if budgeted and (reservation is not None or handed):
            self._settle(entries, reservation.granted if reservation else 0, handed, lost)
        if not taken and not failures:
            # Every shard's server is held as hung: none asked.
            raise QueueTimedOut(
                f"queue {self.keys.queue}: no shard's server answers (each was given "
                f"{FETCH_PATIENCE_SECONDS:g} s); probing them"
            )
        if not taken:
            # (Not noted as this fetcher's last: its repeat asks every shard due, and those
            # that failed replay it, see _repeats; asking only those would wait out their
            # outage.)
            raise failures[0]
        if any(result.unreserved for _, result in taken):
            # A rate set at run time, which this process had not heard of: reserve.
            self._run_time_rate = True
        if request:
            self._last_fetch[fetcher] = (request, asked)
        with self._lock:
            if asked[-1] in self._order:
                self._cursor = (self._order.index(asked[-1]) + 1) % len(self._order)
        merged = self._merged(taken, more=len(asked) < len(visits))
        if reservation is not None and reservation.granted < wanted:
            return _gated(merged, reservation)
        return merged

    def _budgeted(self) -> bool:
        """Whether this queue's fetches reserve from its budget on shard 0 (engine.flow):
        it has a rate limit or a cap, set or (as last heard) a rate set at run time."""
        limits = self.limits
        return limits.rate_limit is not None or limits.max_in_flight > 0 or self._run_time_rate

    def _settle(self, entries: str, reserved: int, handed: list[Delivery], lost: int) -> None:
        """Settle a reservation on shard 0 once the shards answered (one call, only when
        there is something to settle): give back what they did not use, but the ``lost``
        part (asked of shards that failed: their script may have run, its reply lost),
        log what they handed out beyond it (a shard repeating a lost request hands out
        again all it recorded), and under a cap hold the slots of all they handed out.
        If shard 0 cannot be reached, the deliveries still go out: the hand-outs not given
        back count against the rate until they leave its window, the reserved slots hold
        until their lease would run out."""
        capped = self.limits.max_in_flight > 0
        if not capped and len(handed) == reserved:
            return
        ids = [delivery.id for delivery in handed] if capped else []
        used = min(len(handed) + lost, reserved)
        beyond = max(len(handed) - reserved, 0)
        try:
            self.base.settle(entries, reserved, used, ids, beyond)
        except (RedisError, OSError) as error:
            logger.warning(
                "queue %s: settling a reservation on shard 0 failed (%s); what it did not "
                "use is given back as its entries run out",
                self.keys.queue,
                error,
            )

    def _held_back(
        self,
        reservation: Reservation,
        visits: list[str],
        fetcher: str,
        request: str,
        entries: str,
    ) -> FetchResult:
        """A fetch the gates granted nothing: look again when shard 0 said (or within
        LOOK_AGAIN_MS, as a paused fetch does). One shard, the first of those due in turn,
        is asked for none, which runs its housekeeping (expiries, leases run out), so that
        a queue held back for long (paused) keeps it up: one round trip more, however many
        shards, each taking its turn. If it repeats a lost request, what it hands out again
        goes out, settled like a repeat's."""
        expired, deliveries = 0, []
        if visits:
            failures: list[Exception] = []
            name = visits[0]
            result = self._fetch_shard(name, 0, fetcher, request, GATES_RESERVED, None, failures)
            with self._lock:
                if name in self._order:
                    self._cursor = (self._order.index(name) + 1) % len(self._order)
            if result is None:
                if timed_out(failures[-1]):
                    self.hold_siblings(name)
            else:
                expired, deliveries = result.expired, result.deliveries
                if deliveries:
                    self._settle(entries, 0, deliveries, 0)
        with self._lock:
            owed = any(plan.owed for plan in self._plans.values())
        again = reservation.again_ms
        return FetchResult(
            now_ms=reservation.now_ms,
            next_ms=reservation.now_ms + LOOK_AGAIN_MS if again is None else again,
            expired=expired,
            deliveries=deliveries,
            exhaustions_owed=owed,
            read_at=reservation.read_at,
            read_within=reservation.read_within,
            capped=reservation.capped,
        )

    def _visits(self, now: float, fetcher: str, request: str) -> tuple[list[str], bool, bool]:
        """The shards a fetch asks, in turn from the cursor: those due by the plan, or all
        of them when no one listens, or IDLE_LOOK_SHARDS of them when none is due, but for
        those whose Redis failed and whose retry has not come (unless every shard's failed);
        whether it repeats a lost fetch, which asks exactly the shards that one asked
        (they hand out again what they took); and whether it is an idle look (none due)."""
        repeated, names = self._last_fetch.get(fetcher, ("", []))
        if request and request == repeated:
            return names, True, False
        with self._lock:
            # (Under the lock: another thread following the register replaces both.)
            order = self._order[self._cursor :] + self._order[: self._cursor]
            # (Asked before its retry, a shard that failed would hold up every fetch, and
            # the others' messages with it, for its timeout again.)
            # A shard whose server is hung is left out even then (see engine.sharding.hangs).
            unheld = [name for name in order if not self._plans[name].held]
            reachable = [name for name in unheld if self._plans[name].retry_at <= now] or unheld
            if not self._listening:
                return reachable, False, False
            due = [name for name in unheld if self._local_due(name) <= now + DUE_SLACK_SECONDS]
            if due:
                overlooked = next(
                    (
                        name
                        for name in reachable
                        if name not in due
                        and self._plans[name].asked_at <= now - LOOK_AGAIN_SECONDS
                    ),
                    None,
                )
                # First, so that the due shards filling the count do not leave it out.
                return ([overlooked] if overlooked else []) + due, False, False
        # With none due, a look in case a wake-up was lost: a slice of them in turn, so that
        # an idle worker's looks (every 30 s) cost at most 1 request a second.
        return reachable[:IDLE_LOOK_SHARDS], False, True

    def _fetch_shard(
        self,
        name: str,
        count: int,
        fetcher: str,
        request: str,
        gates: str,
        leased_from: int | None,
        failures: list[Exception],
        gated: bool = False,
    ) -> FetchResult | None:
        """One shard's fetch, the plan updated from it; None (and the error kept) if its
        Redis failed, which repeats the same request next time."""
        repeat_key = (fetcher, name)
        sent = self._repeats.get(repeat_key, request) if request else ""
        # (A repeat may ask a shard of a layout retired since: it holds nothing.)
        plan = self._plans.get(name) or ShardPlan()
        with self._lock:
            plan.heard_ms = math.inf
            plan.asked_at = time.monotonic()
        try:
            # (Waited for FETCH_PATIENCE_SECONDS at the most: a TimeoutError then, an
            # OSError. The call may take its deliveries after: the repeat hands them out.)
            store = self._store(name)
            result = self._calls.call(
                lambda: store.fetch(
                    count,
                    fetcher=fetcher,
                    request=sent,
                    gates=gates,
                    leased_from=leased_from,
                    gated=gated,
                ),
                FETCH_PATIENCE_SECONDS,
            )
        except (RedisError, OSError) as error:
            if sent:
                self._repeats[repeat_key] = sent
            self._failed(name, plan, error)
            failures.append(error)
            return None
        self._repeats.pop(repeat_key, None)
        self._learn(name, plan, result)
        return result

    def _merged(self, taken: list[tuple[str, FetchResult]], *, more: bool) -> FetchResult:
        """One FetchResult: the clock as the first shard taken from read it. ``more``: the
        fetch stopped, its count reached, before asking every shard it meant to."""
        reference = taken[0][1]
        with self._lock:
            self._reference_ms = _clock_offset(reference)
            earliest = min(self._order, key=self._local_due)
            local = self._local_due(earliest)
            plan = self._plans[earliest]
            owed = any(plan.owed for plan in self._plans.values())
        if local == math.inf:
            next_ms: int | None = None
        elif local == -math.inf or more:
            next_ms = reference.now_ms
        elif plan.retry_at < local:
            next_ms = max(reference.now_ms, int(plan.due_ms))
        else:  # a shard that failed, tried again then
            next_ms = max(reference.now_ms, math.ceil(self._reference_ms + local * 1000))
        return replace(
            reference,
            next_ms=next_ms,
            expired=sum(result.expired for _, result in taken),
            deliveries=[delivery for _, result in taken for delivery in result.deliveries],
            exhaustions_owed=owed,
        )


def _gated(result: FetchResult, reservation: Reservation) -> FetchResult:
    """A fetch the gates granted less than it asked for: the work they held back waits for
    them (look again when shard 0 said, never at once: no spin), and what went out is due
    from its release for the lateness figures (the wait was the gates', not a worker's)."""
    next_ms, capped = result.next_ms, False
    if reservation.again_ms is not None and next_ms is not None and next_ms <= result.now_ms:
        next_ms, capped = reservation.again_ms, reservation.capped
    deliveries = result.deliveries
    if len(deliveries) == reservation.granted:
        # (By the later of shard 0's clock and the reply's: on a Redis Cluster, two masters.)
        released_ms = max(reservation.now_ms, result.now_ms)
        deliveries = [
            replace(delivery, due_ms=max(delivery.due_ms, released_ms)) for delivery in deliveries
        ]
    return replace(result, next_ms=next_ms, deliveries=deliveries, capped=capped)


def _clock_offset(result: FetchResult) -> float:
    """The store's clock minus this process's monotonic clock (ms), as a fetch read them."""
    return result.now_ms + result.now_us / 1000 - result.read_at * 1000
