"""``ShardedStore``: one queue over many shards, each a whole queue to the scripts.

It implements the ``Store`` protocol over one store per shard (Redis or memory), so
``Queue``, the worker and the admin work on a sharded queue as on any other. What names a
message (send, cancel, ack, peek, requeue...) goes to the shard its id names, in one call
per shard it touches: atomic per shard, not across shards. Readers add the shards up:
``stats`` over the shards it can read, counting in ``shards_down`` those it cannot.

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
the others, and raises only when none answers.

Resharding: changing SHARDS moves no message. Shard 0 keeps a register of the layouts
that may hold messages (``layouts``, a set): a store adds a layout before its first
write to one of that layout's shards, and again every LAYOUT_REGISTER_SECONDS (so a
layout retired while some process still sends to it comes back), and readers and
fetches read it every LAYOUTS_RECHECK_SECONDS. The shards of registered layouts other
than this store's own are *draining*: fetched, counted, listed and listened to like the
live ones, only never sent to. Once a draining layout's shards are empty, ``retire``
takes it off the register (the ``delayqueue_shards --retire`` command); nothing retires a
layout on its own, since only the operator knows that no process still sends to it.

Clocks: each shard's scripts judge what is due by its own server's clock, so nothing is
ever handed out early. The plan takes the shards' clocks for one (on one server they are;
a Redis Cluster's masters agree to within what NTP keeps them): a master whose clock runs
ahead of the others by some milliseconds has its shards' messages fetched up to that much
late, one behind by as much early, which its script answers with the due time again.
"""

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from redis.exceptions import RedisError

from delayqueue_django.engine.errors import timed_out
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.protocol import ChannelSubscription, ShardStore, Store
from delayqueue_django.engine.records import (
    BURY,
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
    ScheduleFailure,
    ScheduleListing,
    ScheduleRecord,
    ScheduleReply,
    StoredMessage,
    StoreLimits,
    Tick,
)
from delayqueue_django.engine.shard_stats import partial_stats, read_stats
from delayqueue_django.engine.shards import (
    LAYOUTS_CHANGED,
    MAX_SHARDS,
    SHARD_MARK,
    layout_names,
    parse_name,
    place,
    shard_keys,
    shard_name,
    shard_of,
)

logger = logging.getLogger("delayqueue_django.engine")

# A shard whose Redis failed a fetch is tried again after this long.
SHARD_RETRY_SECONDS = 1.0
# The register of layouts is read again this often (by fetches and readers)...
LAYOUTS_RECHECK_SECONDS = 10.0
# ...and a sending store writes its own layout to it again this often.
LAYOUT_REGISTER_SECONDS = 60.0
# Message counts: a layout is drained when every one is 0 on each of its shards.
HELD = ("pending", "ready", "unack", "retry", "garbage", "unannounced")
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

T = TypeVar("T")


@dataclass
class _Plan:
    """What this process knows of one shard."""

    # When the shard next has work, on its own clock (ms): -inf to look at once (unknown,
    # or work waiting), inf when it holds nothing that will come due (empty).
    due_ms: float = -math.inf
    # The earliest wake-up heard since the shard's last fetch began: a fetch's reply may
    # predate it, and must not erase it.
    heard_ms: float = math.inf
    # Its last fetch (False before any), and when the last was asked for (monotonic s).
    fetched: bool = False
    asked_at: float = -math.inf
    # Its last fetch said an exhaustion is owed.
    owed: bool = False
    # While its fetches fail: since when, and not to be tried again before (monotonic s).
    failing_since: float | None = None
    retry_at: float = -math.inf


class ShardedStore:
    """A queue spread over the shards of ``layout`` (see engine.shards), which also reads
    and drains the shards of the other layouts registered on shard 0. A store of layout 1
    is an unsharded queue that still finds, drains and lists what an earlier layout left."""

    def __init__(
        self,
        base: ShardStore,
        layout: int,
        make: Callable[[QueueKeys], ShardStore],
    ) -> None:
        self.layout = layout
        self._make = make
        self.shards: dict[str, ShardStore] = {"0": base}
        for index in range(1, layout):
            self.shards[shard_name(layout, index)] = make(shard_keys(base.keys, layout, index))
        # The shards fetched from, in turn: the live ones, then the draining ones.
        self._order = list(self.shards)
        # Shards of other layouts, built when an id names one (a message of another layout).
        self._others: dict[str, ShardStore] = {}
        # The other layouts registered on shard 0, and when the register was last read.
        self._draining: tuple[int, ...] = ()
        self._layouts_read_at = -math.inf
        # layout -> when this store last put it on the register (monotonic s).
        self._registered_at: dict[int, float] = {}
        # Bumped whenever the shards fetched from change: subscriptions follow.
        self.generation = 0
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._plans = {name: _Plan() for name in self._order}
        # Where the next fetch starts; processes start at different shards.
        self._cursor = random.randrange(layout)
        # The queue's clock minus this process's monotonic clock (ms), from the last fetch.
        self._reference_ms: float | None = None
        # (fetcher, shard) -> the request a failed fetch of that shard must repeat.
        self._repeats: dict[tuple[str, str], str] = {}
        # fetcher -> (request, the shards that request's fetch asked): a repeat asks them.
        self._last_fetch: dict[str, tuple[str, list[str]]] = {}
        # How many wake-up subscriptions of this store listen: the plan is trusted only then.
        self._listening = 0

    @property
    def base(self) -> ShardStore:
        return self.shards["0"]

    @property
    def keys(self) -> QueueKeys:
        return self.base.keys

    @property
    def limits(self) -> StoreLimits:
        return self.base.limits

    @property
    def client(self) -> Any:
        """The Redis client (every shard's), or None in memory."""
        return getattr(self.base, "client", None)

    # Layouts

    def consumed(self) -> dict[str, ShardStore]:
        """Every shard this store reads, by name: the live ones, then the draining ones
        (the register read again when it is due)."""
        self.refresh_layouts()
        return {name: self._store(name) for name in self._order}

    @property
    def shard_count(self) -> int:
        """How many shards this store fetches from, as last read."""
        return len(self._order)

    def draining(self) -> tuple[int, ...] | None:
        """The other layouts this store drains, or None when the register is due to be
        read again (or never was)."""
        if time.monotonic() >= self._layouts_read_at + LAYOUTS_RECHECK_SECONDS:
            return None
        return self._draining

    def refresh_layouts(self, *, force: bool = False, due: bool = False) -> None:
        """Read the register of layouts if it is time (or it is ``due`` now, or ``force``d:
        raising if it cannot be read); the shards fetched from follow it. A register that
        cannot be read is tried again after SHARD_RETRY_SECONDS, the shards as they were
        meanwhile."""
        if (
            not (force or due)
            and time.monotonic() < self._layouts_read_at + LAYOUTS_RECHECK_SECONDS
        ):
            return
        # One reading at a time (the fetch loop's, the listener's on LAYOUTS_CHANGED, an
        # operator's): one read earlier and followed later would undo a newer one. A
        # routine recheck that finds another under way leaves it to that one.
        if not self._refresh_lock.acquire(blocking=force or due):
            return
        try:
            self._read_layouts(force=force)
        finally:
            self._refresh_lock.release()

    def _read_layouts(self, *, force: bool) -> None:
        now = time.monotonic()
        try:
            registered = self.base.layouts()
        except (RedisError, OSError) as error:
            self._layouts_read_at = now - LAYOUTS_RECHECK_SECONDS + SHARD_RETRY_SECONDS
            logger.debug("queue %s: reading its layouts failed: %s", self.keys.queue, error)
            if force:
                raise
            return
        self._layouts_read_at = now
        draining = tuple(
            sorted(
                layout
                for layout in registered
                if layout != self.layout and 1 < layout <= MAX_SHARDS
            )
        )
        if draining != self._draining:
            self._follow(draining)

    def _follow(self, draining: tuple[int, ...]) -> None:
        """Fetch from the live shards and those of ``draining``."""
        names = list(self.shards)
        for layout in draining:
            names += [name for name in layout_names(layout) if name not in self.shards]
        for name in names:
            self._store(name)  # built outside the lock
        with self._lock:
            before = self._draining
            self._draining = draining
            self._order = names
            self._plans = {name: self._plans.get(name) or _Plan() for name in names}
            self._cursor %= len(names)
            self.generation += 1
        added = sorted(set(draining) - set(before))
        gone = sorted(set(before) - set(draining))
        if added:
            logger.info(
                "queue %s: draining the shards of layout %s (SHARDS is %d here)",
                self.keys.queue,
                ", ".join(map(str, added)),
                self.layout,
            )
        if gone:
            logger.info("queue %s: layout %s retired", self.keys.queue, ", ".join(map(str, gone)))

    def _register(self, groups: Iterable[str]) -> None:
        """Put the layouts of the shards about to be written (``groups``: their names) on
        the register first, and again now and then. The first time must succeed: a message
        on a shard of a layout no one knows of would wait for a worker of that layout.
        (The layout an id names, not this store's: a relay writes what other processes
        placed, perhaps with another SHARDS.)"""
        now = time.monotonic()
        for layout in {parse_name(name)[0] for name in groups if name != "0"}:
            registered_at = self._registered_at.get(layout)
            if registered_at is not None and now < registered_at + LAYOUT_REGISTER_SECONDS:
                continue
            try:
                self.base.add_layout(layout)
            except (RedisError, OSError):
                if registered_at is None:
                    raise
                logger.debug("queue %s: registering layout %d failed", self.keys.queue, layout)
                continue
            self._registered_at[layout] = now

    def retire(self, layout: int) -> dict[str, dict[str, int]]:
        """Take ``layout`` off the register if its shards hold nothing (its shard 0 is
        every layout's, and is not asked). Returns the shards that still hold messages,
        by name, with their counts: empty when the layout was retired."""
        if layout == self.layout:
            raise ValueError(f"layout {layout} is this queue's SHARDS: it cannot be retired")
        if not 1 < layout <= MAX_SHARDS:
            raise ValueError(f"{layout!r} is not a layout (2 to {MAX_SHARDS})")
        holding = {}
        for name in layout_names(layout)[1:]:
            stats = self._store(name).stats()
            if any(stats[count] for count in HELD):
                holding[name] = {count: stats[count] for count in HELD}
        if not holding:
            self.base.retire_layout(layout)
            self.refresh_layouts(force=True)
        return holding

    # Where messages go

    def place(self, message_ids: list[str]) -> list[str]:
        """Each new id with a shard of this layout (see shards.place)."""
        return place(message_ids, self.layout)

    def shard_for(self, message_id: str) -> ShardStore:
        """The store of the shard an id names (of any layout)."""
        return self._store(shard_name(*shard_of(message_id)))

    def _store(self, name: str) -> ShardStore:
        store = self.shards.get(name) or self._others.get(name)
        if store is None:
            layout, index = parse_name(name)
            with self._lock:
                store = self._others.get(name)
                if store is None:
                    store = self._make(shard_keys(self.keys, layout, index))
                    self._others[name] = store
        return store

    @staticmethod
    def _group(ids: Iterable[str]) -> dict[str, list[int]]:
        """Positions of the ids by the shard each names, in order of first appearance."""
        groups: dict[str, list[int]] = {}
        for position, message_id in enumerate(ids):
            # (Most ids of a queue of one shard name none: no need to parse them.)
            name = shard_name(*shard_of(message_id)) if SHARD_MARK in message_id else "0"
            groups.setdefault(name, []).append(position)
        return groups

    def _per_shard(
        self,
        items: Sequence[T],
        id_of: Callable[[T], str],
        call: Callable[[ShardStore, list[T]], Sequence[Any]],
        *,
        register: bool = False,
    ) -> list[Any]:
        """``call`` once per shard with its items; the replies back in the items' order
        (each reply has one entry per item). ``register``: writes that make messages, whose
        layouts go on the register first."""
        groups = self._group(id_of(item) for item in items)
        if register:
            self._register(groups)
        if len(groups) == 1:
            ((name, _),) = groups.items()
            return list(call(self._store(name), list(items)))
        replies: list[Any] = [None] * len(items)
        for name, positions in groups.items():
            for position, reply in zip(
                positions, call(self._store(name), [items[i] for i in positions]), strict=True
            ):
                replies[position] = reply
        return replies

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        return self._per_shard(
            messages, _message_id, lambda store, part: store.send(part), register=True
        )

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        groups = self._group(message.id for message in messages)
        self._register(groups)
        forgotten = self._group(forget)
        replies: list[int | None] = [None] * len(messages)
        names = [*groups, *(name for name in forgotten if name not in groups)]
        # A call with nothing to write or forget is for what every call does on the way
        # (dropping notes older than keep_ms): every shard's.
        for name in names or self._order:
            positions = groups.get(name, [])
            dues = self._store(name).relay(
                [messages[i] for i in positions],
                forget=[forget[i] for i in forgotten.get(name, [])],
                keep_ms=keep_ms,
            )
            for position, due in zip(positions, dues, strict=True):
                replies[position] = due
        return replies

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        return self.shard_for(message_id).remove(
            message_id,
            include_in_flight_and_dead=include_in_flight_and_dead,
            only_from=only_from,
        )

    # Consumers

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        self.refresh_layouts()
        if len(self._order) == 1:
            # One shard (SHARDS 1, nothing to drain): the plan would only echo its reply.
            return self.base.fetch(count, fetcher=fetcher, request=request)
        visits, repeating = self._visits(time.monotonic(), fetcher, request)
        taken: list[tuple[str, FetchResult]] = []
        asked: list[str] = []
        failures: list[Exception] = []
        held_back: set[str] = set()

        def ask(names: Iterable[str], *, to_the_end: bool) -> None:
            """Fetch from each shard in turn until ``count`` (or from every one, if told),
            but for those held back meanwhile (a shard on their server timed out)."""
            remaining = count - sum(len(result.deliveries) for _, result in taken)
            for name in names:
                if remaining <= 0 < count and not to_the_end:
                    return
                if not to_the_end and name in held_back:
                    continue
                asked.append(name)
                # (A fetch of none still has each shard it asks retry what expired.)
                result = self._fetch_shard(name, max(remaining, 0), fetcher, request, failures)
                if result is not None:
                    taken.append((name, result))
                    remaining -= len(result.deliveries)
                elif timed_out(failures[-1]):
                    held_back.update(self.hold_siblings(name))

        ask(visits, to_the_end=repeating)
        if not taken and not repeating:
            # Every shard asked failed: ask the others that are not failing, so that one
            # master down never holds up the rest (nor leaves this fetch without a clock).
            now = time.monotonic()
            with self._lock:
                others = [
                    name
                    for name in self._order
                    if name not in asked and self._plans[name].retry_at <= now
                ]
            ask(others, to_the_end=False)
        if not taken:
            # (Not noted as this fetcher's last: its repeat asks every shard due, and those
            # that failed replay it, see _repeats; asking only those would wait out their
            # outage.)
            raise failures[0]
        if request:
            self._last_fetch[fetcher] = (request, asked)
        with self._lock:
            if asked[-1] in self._order:
                self._cursor = (self._order.index(asked[-1]) + 1) % len(self._order)
        return self._merged(taken, more=len(asked) < len(visits))

    def _visits(self, now: float, fetcher: str, request: str) -> tuple[list[str], bool]:
        """The shards a fetch asks, in turn from the cursor: those due by the plan, or all
        of them when no one listens, or IDLE_LOOK_SHARDS of them when none is due, but for
        those whose Redis failed and whose retry has not come (unless every shard's failed);
        and whether it repeats a lost fetch, which asks exactly the shards that one asked
        (they hand out again what they took)."""
        repeated, names = self._last_fetch.get(fetcher, ("", []))
        if request and request == repeated:
            return names, True
        with self._lock:
            # (Under the lock: another thread following the register replaces both.)
            order = self._order[self._cursor :] + self._order[: self._cursor]
            # (Asked before its retry, a shard that failed would hold up every fetch, and
            # the others' messages with it, for its timeout again.)
            reachable = [name for name in order if self._plans[name].retry_at <= now] or order
            if not self._listening:
                return reachable, False
            due = [name for name in order if self._local_due(name) <= now + DUE_SLACK_SECONDS]
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
                return ([overlooked] if overlooked else []) + due, False
        # With none due, a look in case a wake-up was lost: a slice of them in turn, so that
        # an idle worker's looks (every 30 s) cost at most 1 request a second.
        return reachable[:IDLE_LOOK_SHARDS], False

    def _fetch_shard(
        self, name: str, count: int, fetcher: str, request: str, failures: list[Exception]
    ) -> FetchResult | None:
        """One shard's fetch, the plan updated from it; None (and the error kept) if its
        Redis failed, which repeats the same request next time."""
        repeat_key = (fetcher, name)
        sent = self._repeats.get(repeat_key, request) if request else ""
        # (A repeat may ask a shard of a layout retired since: it holds nothing.)
        plan = self._plans.get(name) or _Plan()
        with self._lock:
            plan.heard_ms = math.inf
            plan.asked_at = time.monotonic()
        try:
            result = self._store(name).fetch(count, fetcher=fetcher, request=sent)
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
        """Shard ``name``'s server did not answer in time: the other shards on it are not
        asked before their retry either (each would wait out its own timeout, the other
        servers' shards held up meanwhile: a queue of 12 shards on one server, 12 socket
        timeouts). Returns them."""
        server = self._store(name).server_name()
        with self._lock:
            order = list(self._order)
        siblings = [
            other for other in order if other != name and self._store(other).server_name() == server
        ]
        retry_at = time.monotonic() + SHARD_RETRY_SECONDS
        with self._lock:
            for other in siblings:
                plan = self._plans.get(other)
                if plan is not None:
                    plan.retry_at = max(plan.retry_at, retry_at)
        return siblings

    def _failed(self, name: str, plan: _Plan, error: Exception) -> None:
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

    def _learn(self, name: str, plan: _Plan, result: FetchResult) -> None:
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

    def ack(
        self, leases: Sequence[tuple[str, int]], *, fetcher: str = "", request: str = ""
    ) -> set[str]:
        acked: set[str] = set()
        for name, positions in self._group(message_id for message_id, _ in leases).items():
            part = [leases[i] for i in positions]
            acked |= self._store(name).ack(part, fetcher=fetcher, request=request)
        return acked

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
    ) -> list[NackOutcome]:
        outcomes: list[NackOutcome] = self._per_shard(
            refusals,
            _refusal_id,
            lambda store, part: store.nack(part, fetcher=fetcher, request=request),
        )
        self._look_again(
            shard_name(*shard_of(refusal[0])) for refusal in refusals if refusal[2] != BURY
        )
        # Their exhaustions are owed: the next claim asks their shards (a fetch would say
        # so only later).
        exhausted = {shard_name(*shard_of(outcome.id)) for outcome in outcomes if outcome.exhausted}
        with self._lock:
            for name in exhausted:
                plan = self._plans.get(name)
                if plan is not None:
                    plan.owed = True
        return outcomes

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        released: list[str] = []
        groups = self._group(message_id for message_id, _ in leases)
        for name, positions in groups.items():
            released += self._store(name).release([leases[i] for i in positions])
        self._look_again(groups)
        return released

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        if not leases:
            return self.base.extend(leases)
        deadlines, extended = [], []
        for name, positions in self._group(message_id for message_id, _ in leases).items():
            deadline, ids = self._store(name).extend([leases[i] for i in positions])
            deadlines.append(deadline)
            extended += ids
        # The earliest: no delivery is told it holds longer than its shard keeps it.
        return min(deadlines), extended

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """From the shards whose last fetch said one is owed, or never fetched (every
        shard, when none is), in turn, until ``count``. A shard that cannot be reached is
        passed over (its announcements wait for it); raises only if every one asked fails."""
        with self._lock:
            order = list(self._order)
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

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        confirmed = 0
        for name, positions in self._group(message_id for message_id, _ in claims).items():
            confirmed += self._store(name).confirm_exhausted([claims[i] for i in positions])
        return confirmed

    def subscribe_wakeups(self) -> "ShardedWakeups":
        return ShardedWakeups(self)

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

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        requeued: list[str] = []
        groups = self._group(message_ids)
        for name, positions in groups.items():
            store = self._store(name)
            requeued += store.requeue([message_ids[i] for i in positions], default_budget)
        self._look_again(groups)
        return requeued

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        promoted: list[str] = []
        groups = self._group(message_ids)
        for name, positions in groups.items():
            promoted += self._store(name).promote([message_ids[i] for i in positions])
        self._look_again(groups)
        return promoted

    def drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        limit: int,
        keep_unannounced: bool,
        offset: int = 0,
        buried_before_ms: int | None = None,
    ) -> tuple[int, int]:
        """Every shard to its end, each in calls of ``limit`` that pass over what the
        shard's earlier calls kept. The caller's ``offset`` counts over all shards, which
        names no place in any one, so one call does the whole work: it reports nothing kept,
        and a caller that goes on because ``limit`` were dropped finds nothing more."""
        dropped = 0
        for store in self.consumed().values():
            kept = 0
            while True:
                dropped_now, kept_now = store.drop_garbage(
                    older_than_ms=older_than_ms,
                    limit=limit,
                    keep_unannounced=keep_unannounced,
                    offset=kept,
                    buried_before_ms=buried_before_ms,
                )
                dropped += dropped_now
                kept += kept_now
                if dropped_now + kept_now < limit:
                    break
        return dropped, 0

    def stats(self) -> dict[str, int]:
        """The shards' stats added up (see combined_stats), over those that could be read
        (see read_stats), and ``shards_down``: how many could not. Raises the first error
        only when none could be read."""
        read = read_stats(self.consumed())
        answered = [stats for stats in read.values() if not isinstance(stats, Exception)]
        if not answered:
            raise next(stats for stats in read.values() if isinstance(stats, Exception))
        return partial_stats(answered, len(read))

    def throughput(self, minutes: int) -> list[tuple[int, int, int]]:
        by_minute: dict[int, tuple[int, int]] = {}
        for store in self.consumed().values():
            for minute, acked, failed in store.throughput(minutes):
                before = by_minute.get(minute, (0, 0))
                by_minute[minute] = (before[0] + acked, before[1] + failed)
        # Shards on one server share its clock; on a cluster, masters' clocks may put the
        # current minute a minute apart: keep the latest ``minutes``.
        rows = [(minute, acked, failed) for minute, (acked, failed) in sorted(by_minute.items())]
        return rows[-minutes:]

    def prune_throughput(self, keep_minutes: int) -> int:
        return sum(store.prune_throughput(keep_minutes) for store in self.consumed().values())

    def add_totals(self, increments: Mapping[str, int]) -> None:
        """Worker-measured counts belong to no shard: kept on shard 0."""
        self.base.add_totals(increments)

    def totals(self) -> dict[str, int]:
        summed: dict[str, int] = {}
        for store in self.consumed().values():
            for name, count in store.totals().items():
                summed[name] = summed.get(name, 0) + count
        return summed

    def list(
        self, state: str, *, offset: int, limit: int, preview_bytes: int
    ) -> list[StoredMessage]:
        """A page over every shard: sorted sets merged by score (due time, deadline, burial
        time), lists one shard after the other. Each shard is read up to the page's end,
        so a deep page costs every shard that many entries."""
        stores = list(self.consumed().values())
        if len(stores) == 1:
            return stores[0].list(state, offset=offset, limit=limit, preview_bytes=preview_bytes)
        pages = [
            store.list(state, offset=0, limit=offset + limit, preview_bytes=preview_bytes)
            for store in stores
        ]
        merged = [message for page in pages for message in page]
        if state not in ("ready", "retry"):
            merged.sort(key=lambda message: message.score_ms or 0)
        return merged[offset : offset + limit]

    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        return self.shard_for(message_id).peek(message_id, preview_bytes=preview_bytes)

    def peek_payload(self, message_id: str) -> bytes | None:
        return self.shard_for(message_id).peek_payload(message_id)

    def held(self, message_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for name, positions in self._group(message_ids).items():
            found |= self._store(name).held([message_ids[i] for i in positions])
        return found

    # Schedules, task results and heartbeats: on shard 0 (a tick is a message of shard 0,
    # written with its schedule's record); a task's result with its message.

    def read_schedules(self) -> ScheduleListing:
        return self.base.read_schedules()

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        return self.base.read_schedule(name)

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        return self.base.write_tick(name, fingerprint, tick)

    def define_schedule(
        self,
        name: str,
        definition: str,
        fingerprint: str,
        *,
        expect: str,
        start_ms: int,
        first: Tick | None,
    ) -> ScheduleReply:
        return self.base.define_schedule(
            name, definition, fingerprint, expect=expect, start_ms=start_ms, first=first
        )

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        return self.base.pause_schedule(name, start_ms)

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        return self.base.resume_schedule(name, fingerprint, start_ms, first)

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        return self.base.remove_schedule(name, fingerprint)

    def declare_schedule(self, name: str) -> ScheduleReply:
        return self.base.declare_schedule(name)

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        return self.base.retire_schedule(name, fingerprint, undeclared_ms)

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        return self.base.report_schedule_failure(name, fingerprint, failure)

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        return self.shard_for(result_id).write_result(
            result_id, fields, unless_set=unless_set, ttl_seconds=ttl_seconds
        )

    def read_result(self, result_id: str) -> dict[str, str]:
        return self.shard_for(result_id).read_result(result_id)

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        self.base.put_heartbeat(worker_id, details, ttl_ms)

    def drop_heartbeat(self, worker_id: str) -> None:
        self.base.drop_heartbeat(worker_id)

    def heartbeats(self) -> dict[str, str]:
        return self.base.heartbeats()


class ShardedWakeups:
    """Every shard's wake-ups in one subscription, each told to the plan on its way. When
    the shards fetched from change (a layout to drain, or one retired), it subscribes
    again to the new list, and has the consumer look at every shard at once: what was
    published in between went unheard."""

    def __init__(self, store: ShardedStore) -> None:
        self._store = store
        self._generation, self._inner, self._names = store._subscribe()
        self._listening = True
        store.listening(+1)
        # What was published before this subscription took effect went unheard (a lost
        # subscription's replacement: the plan learnt since may say a shard is empty that
        # no longer is, and a later send there publishes nothing behind an older head).
        store._look_again(self._names.values())

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._generation != self._store.generation:
                    return self._follow()
                heard = self._inner.wait_on(max(deadline - time.monotonic(), 0.0))
            except BaseException:
                # Wake-ups go unheard until the next subscription: the plan is not to be
                # trusted.
                self._stop_listening()
                raise
            if heard is None:
                return None
            channel, due_ms = heard
            name = self._names.get(channel)
            if name == "0" and due_ms == LAYOUTS_CHANGED:
                # A layout new on the register: read it now (the loop follows it if it
                # changes the shards fetched from; else there is nothing to tell).
                self._store.refresh_layouts(due=True)
                continue
            if name is not None:
                self._store.heard(name, due_ms)
            return due_ms

    def _follow(self) -> int:
        """Subscribe anew to the shards now fetched from; a wake-up due at once."""
        self._inner.close()
        self._generation, self._inner, self._names = self._store._subscribe()
        self._store._look_again(self._names.values())
        return 0

    def close(self) -> None:
        self._stop_listening()
        self._inner.close()

    def _stop_listening(self) -> None:
        if self._listening:
            self._listening = False
            self._store.listening(-1)


def parts(store: Store) -> dict[str, ShardStore]:
    """A queue's stores that each hold one set of keys, by shard name: every shard of a
    sharded queue, else the store itself as shard "0"."""
    if isinstance(store, ShardedStore):
        return store.consumed()
    return {"0": store}  # type: ignore[dict-item]  # every unsharded store is a ShardStore


def _clock_offset(result: FetchResult) -> float:
    """The store's clock minus this process's monotonic clock (ms), as a fetch read them."""
    return result.now_ms + result.now_us / 1000 - result.read_at * 1000


def _message_id(message: NewMessage) -> str:
    return message.id


def _refusal_id(refusal: tuple[str, int, int]) -> str:
    return refusal[0]


__all__ = [
    "ShardedStore",
    "ShardedWakeups",
    "layout_names",
    "parts",
]
