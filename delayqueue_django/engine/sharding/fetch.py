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
"""

import logging
import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from functools import partial

from redis.exceptions import RedisError

from delayqueue_django.engine.errors import QueueTimedOut, timed_out
from delayqueue_django.engine.flow import GATES_RESERVED, GATES_SHARD, Reservation
from delayqueue_django.engine.protocol import ChannelSubscription
from delayqueue_django.engine.records import Delivery, ExhaustedClaim, FetchResult
from delayqueue_django.engine.sharding.hangs import (
    FETCH_PATIENCE_SECONDS,
    Hang,
    start_probe,
    wait_for_probes,
)
from delayqueue_django.engine.sharding.layouts import SHARD_RETRY_SECONDS, ShardLayouts
from delayqueue_django.engine.sharding.plan import ShardPlan

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


class ShardFetching(ShardLayouts):
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

    def _failing(self, name: str) -> bool:
        with self._lock:
            plan = self._plans.get(name)
            return plan is not None and plan.failing_since is not None

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

    def on_same_server(self, name: str) -> list[str]:
        """The other shards fetched from whose keys are on shard ``name``'s server, as the
        client last learned it (no round trip): a server that hangs hangs them all."""
        server = self._store(name).server_name()
        with self._lock:
            order = list(self._order)
        return [
            other for other in order if other != name and self._store(other).server_name() == server
        ]

    def hold_siblings(self, name: str) -> list[str]:
        """Shard ``name``'s server did not answer in time: it is held as hung, its shards
        (the other shards on it too) not asked until a probe of it answers (each would
        wait out its own timeout, the other servers' shards held up meanwhile: a queue of
        12 shards on one server, 12 socket timeouts). Returns the others."""
        siblings = self.on_same_server(name)
        server = self._store(name).server_name()
        now = time.monotonic()
        with self._lock:
            new = server not in self._hung.hangs
            hang = self._hung.hold(server, {name, *siblings}, now)
            self._hold_plans(hang)
        if new:
            logger.warning(
                "queue %s: server %s did not answer in time; its shards (%s) are left out "
                "of fetches until it answers a probe",
                self.keys.queue,
                server,
                ", ".join(sorted(hang.shards)),
            )
        return siblings

    def _hold_plans(self, hang: Hang) -> None:
        """The plans of a hung server's shards: held, looked at again at its next probe
        (the consumer wakes then: it may have answered); lock held."""
        for shard in hang.shards:
            plan = self._plans.get(shard)
            if plan is not None:
                plan.held = True
                plan.retry_at = hang.probe_at

    def _probe_hung(self, now: float) -> None:
        """Start a probe of each hung server whose backoff is over (none on a healthy
        queue: an empty dict looked at). With every shard held, the fetch has nothing
        else to ask: it waits for them, FETCH_PATIENCE_SECONDS at the most."""
        if not self._hung.hangs:
            return
        with self._lock:
            due, passed = self._hung.due(now)
            for hang in passed:
                self._hold_plans(hang)
        probes = [
            start_probe(
                server,
                partial(self._store(min(hang.shards)).fetch, 0),
                partial(self._probed, server),
            )
            for server, hang in due
        ]
        with self._lock:
            every_shard_held = all(self._plans[name].held for name in self._order)
        if probes and every_shard_held:
            wait_for_probes(probes, FETCH_PATIENCE_SECONDS)

    def _probed(self, server: str, answered: bool) -> None:
        """A probe's outcome: an answer ends the hold, its shards looked at at once."""
        with self._lock:
            hang = self._hung.hangs.get(server)
            if hang is None:
                return
            if not answered:
                hang.probe_failed(time.monotonic())
                self._hold_plans(hang)
                return
            del self._hung.hangs[server]
            for shard in hang.shards:
                plan = self._plans.get(shard)
                if plan is not None:
                    plan.held = False
                    plan.retry_at = -math.inf
                    plan.due_ms = -math.inf
        logger.warning(
            "queue %s: server %s answers again after %.1f s; its shards are fetched from again",
            self.keys.queue,
            server,
            time.monotonic() - hang.since,
        )

    def _failed(self, name: str, plan: ShardPlan, error: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            plan.retry_at = now + SHARD_RETRY_SECONDS
            first = plan.failing_since is None
            if first:
                plan.failing_since = now
        if first:
            logger.warning(
                "queue %s: shard %s cannot be reached (%s); its messages wait, the other "
                "shards go on; trying it every %g s",
                self.keys.queue,
                name,
                error,
                SHARD_RETRY_SECONDS,
            )

    def _learn(self, name: str, plan: ShardPlan, result: FetchResult) -> None:
        if result.next_ms is None:
            due_ms = math.inf
        elif result.next_ms <= result.now_ms:
            due_ms = -math.inf
        else:
            due_ms = result.next_ms
        with self._lock:
            plan.fetched = True
            plan.due_ms = min(due_ms, plan.heard_ms)
            plan.owed = result.exhaustions_owed
            plan.retry_at = -math.inf
            failing_since, plan.failing_since = plan.failing_since, None
        if failing_since is not None:
            logger.warning(
                "queue %s: shard %s reached again after %.1f s",
                self.keys.queue,
                name,
                time.monotonic() - failing_since,
            )

    def _local_due(self, name: str) -> float:
        """When shard ``name`` next has work, on the monotonic clock (s); lock held."""
        plan = self._plans[name]
        if plan.due_ms in (-math.inf, math.inf):
            local = plan.due_ms
        elif self._reference_ms is None:
            local = -math.inf
        else:
            local = (plan.due_ms - self._reference_ms) / 1000
        return max(local, plan.retry_at)

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

    def listening(self, change: int) -> None:
        """A wake-up subscription of this store began (+1) or ended (-1) listening."""
        with self._lock:
            self._listening += change

    def heard(self, name: str, due_ms: int) -> None:
        """A wake-up from shard ``name``, due at ``due_ms``: the plan learns it."""
        with self._lock:
            plan = self._plans.get(name)
            if plan is not None:
                plan.heard_ms = min(plan.heard_ms, due_ms)
                plan.due_ms = min(plan.due_ms, due_ms)

    def _look_again(self, names: Iterable[str]) -> None:
        """Work may have come due on these shards (a retry, a hand-back, a requeue)."""
        with self._lock:
            for name in names:
                plan = self._plans.get(name)
                if plan is not None:
                    plan.due_ms = -math.inf

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """From the shards whose last fetch said one is owed, or never fetched (every
        shard, when none is), in turn, until ``count``. A shard that cannot be reached is
        passed over (its announcements wait for it); raises only if every one asked fails."""
        with self._lock:
            # (Not the shards of a hung server: each would wait out a socket timeout.)
            order = [name for name in self._order if not self._plans[name].held] or list(
                self._order
            )
            owed = [
                name for name in order if self._plans[name].owed or not self._plans[name].fetched
            ]
        claims: list[ExhaustedClaim] = []
        asked_shards = failed = 0
        for name in owed or order:
            if len(claims) >= count:
                break
            asked = count - len(claims)
            asked_shards += 1
            try:
                found = self._store(name).claim_exhausted(asked, claim_ms)
            except (RedisError, OSError):
                failed += 1
                if failed == asked_shards == len(owed or order):
                    raise
                continue
            claims += found
            if len(found) < asked:
                with self._lock:
                    # (Its layout may have been retired meanwhile: no plan left.)
                    plan = self._plans.get(name)
                    if plan is not None:
                        plan.owed = False
        return claims

    def _subscribe(self) -> tuple[int, ChannelSubscription, dict[str, str]]:
        """A subscription to the wake-ups of every shard fetched from, and the generation
        of that list of shards."""
        self.refresh_layouts()
        with self._lock:
            generation, names = self.generation, list(self._order)
        channels = {self._store(name).keys.wakeup_channel: name for name in names}
        subscription = self.base.subscribe_channels(list(channels))
        # A layout announced before the subscription took effect was heard by no one (at a
        # worker's start, its own relay writing rows another layout placed): read the
        # register now. If it changed, the generation returned is behind, and the
        # subscription follows the new list at once.
        self.refresh_layouts(due=True)
        return generation, subscription, channels


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
