"""The shards of a ``ShardedStore``, built and named, and the register of layouts they
follow.

Resharding: changing SHARDS moves no message. Shard 0 keeps a register of the layouts
that may hold messages (``layouts``, a set): a store adds a layout before its first
write to one of that layout's shards, and again every LAYOUT_REGISTER_SECONDS (so a
layout retired while some process still sends to it comes back), and readers and
fetches read it every LAYOUTS_RECHECK_SECONDS. The shards of registered layouts other
than this store's own are *draining*: fetched, counted, listed and listened to like the
live ones, only never sent to. Once a draining layout's shards are empty, ``retire``
takes it off the register (the ``delayqueue_shards --retire`` command); nothing retires a
layout on its own, since only the operator knows that no process still sends to it. A
layout's registration also gives its shards shard 0's flow state (engine.sharding.flow), so a
pause or a rate set at run time holds on them from their first message.

Layout 1 (SHARDS 1: shard 0 alone, which every layout fetches) is on the register only for
its keys: a keyed message sent under one shard waits on shard 0, while the key's shard of
another layout is mostly another one (engine.sharding.store: a key's home). It goes on the
register with the first layout put on an empty register of a queue that has had keys
(add_layout.lua; an empty register says that only processes of one shard wrote, since the
others register their layout before any write, shard 0 included), and before a keyed
write of a process of one shard while other layouts are registered; until then, a store
of more shards that reads an empty register of a queue that has had keys counts layout 1
as registered. It is retired as the others are, once shard 0 holds no keyed message that
only its lookups would find.
"""

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.patient_calls import PatientCalls
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.records import StoreLimits
from delayqueue_django.engine.sharding.flow import NO_FLOW, spread
from delayqueue_django.engine.sharding.hangs import HungServers
from delayqueue_django.engine.sharding.placement import (
    MAX_SHARDS,
    key_shard,
    layout_names,
    parse_name,
    shard_keys,
    shard_name,
)
from delayqueue_django.engine.sharding.plan import ShardPlan

logger = logging.getLogger("delayqueue_django.engine")

# A shard whose Redis failed a fetch is tried again after this long.
SHARD_RETRY_SECONDS = 1.0
# The register of layouts is read again this often (by fetches and readers)...
LAYOUTS_RECHECK_SECONDS = 10.0
# ...and a sending store writes its own layout to it again this often.
LAYOUT_REGISTER_SECONDS = 60.0
# How long a write waits for such a refresh, which runs in a thread of its own: far above a
# healthy call, far below a hung shard 0's socket timeout and retries. A refresh that fails
# is tried again after SHARD_RETRY_SECONDS, and no write waits for it meanwhile: the layout
# was registered before, and a layout retired under a sender is drained once it is back.
REGISTER_PATIENCE_SECONDS = 1.0
# Message counts: a layout is drained when every one is 0 on each of its shards.
HELD = ("pending", "ready", "unack", "retry", "garbage", "unannounced")


class ShardLayouts:
    """The part of a ``ShardedStore`` that knows its shards: the live ones of ``layout``,
    those of the other layouts on the register (draining), and any other an id names. Its
    ``__init__`` builds the whole store's state, the fetch plan's too (engine.sharding.fetch)."""

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
        # layout -> its refresh under way, and not before when one that failed is tried again.
        self._registering: dict[int, threading.Thread] = {}
        self._register_retry_at: dict[int, float] = {}
        self._register_lock = threading.Lock()
        # Bumped whenever the shards fetched from change: subscriptions follow.
        self.generation = 0
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._plans = {name: ShardPlan() for name in self._order}
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
        # The queue has a rate set at run time, as a fetch last heard (see engine.flow).
        self._run_time_rate = False
        # The servers that did not answer a fetch in time, and the threads fetches run in.
        self._hung = HungServers()
        self._calls = PatientCalls("delayqueue-shard-fetch")

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
            registered = on_register = self.base.layouts()
            if not registered and self.layout > 1 and self.base.keys_used():
                # Only processes of one shard have written (see the module's docstring):
                # their keys are looked for on shard 0, as the register will say once this
                # layout is on it.
                registered = {1}
        except (RedisError, OSError) as error:
            self._layouts_read_at = now - LAYOUTS_RECHECK_SECONDS + SHARD_RETRY_SECONDS
            logger.debug("queue %s: reading its layouts failed: %s", self.keys.queue, error)
            if force:
                raise
            return
        self._layouts_read_at = now
        self._forget_retired(on_register)
        draining = tuple(
            sorted(
                layout
                for layout in registered
                if layout != self.layout and 0 < layout <= MAX_SHARDS
            )
        )
        if draining != self._draining:
            self._follow(draining)

    def _forget_retired(self, registered: set[int]) -> None:
        """A layout this store put on the register and no longer finds there was retired
        meanwhile: its next write puts it back first. Waiting for the routine refresh
        (LAYOUT_REGISTER_SECONDS, and only at a write then) could leave a message on a
        shard no worker fetches for good: a relay writing an older layout's last rows."""
        for layout in list(self._registered_at):
            if layout not in registered:
                self._registered_at.pop(layout, None)

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
            if names != self._order:
                self._order = names
                self._plans = {name: self._plans.get(name) or ShardPlan() for name in names}
                self._cursor %= len(names)
                self.generation += 1
        added = sorted(set(draining) - set(before) - {1})
        gone = sorted(set(before) - set(draining) - {1})
        if 1 in set(draining) - set(before):
            logger.info(
                "queue %s: keys sent under SHARDS 1 are looked for on shard 0 (layout 1 is on "
                "the register; SHARDS is %d here)",
                self.keys.queue,
                self.layout,
            )
        if added:
            logger.info(
                "queue %s: draining the shards of layout %s (SHARDS is %d here)",
                self.keys.queue,
                ", ".join(map(str, added)),
                self.layout,
            )
        if gone:
            logger.info("queue %s: layout %s retired", self.keys.queue, ", ".join(map(str, gone)))

    def _register(self, groups: Iterable[str], *, single: bool = False) -> None:
        """Put the layouts of the shards about to be written (``groups``: their names) on
        the register first, and again now and then (see _refresh_registration). The first
        time must succeed: a message on a shard of a layout no one knows of would wait for
        a worker of that layout.
        (The layout an id names, not this store's: a relay writes what other processes
        placed, perhaps with another SHARDS.) Shard 0 is every layout's: a write to it
        registers this store's layout, if it has more than one shard, and layout 1 when
        ``single`` (keyed messages bound for shard 0 as layout 1's: see the module's
        docstring)."""
        now = time.monotonic()
        writing = set(groups)
        layouts = {parse_name(name)[0] for name in writing if name != "0"}
        if "0" in writing:
            if self.layout > 1:
                layouts.add(self.layout)
            if single:
                layouts.add(1)
        for layout in layouts:
            registered_at = self._registered_at.get(layout)
            if registered_at is None:
                self._add_layout(layout, writing)
                self._registered_at[layout] = now
            elif now >= registered_at + LAYOUT_REGISTER_SECONDS:
                self._refresh_registration(layout, now)

    def _add_layout(self, layout: int, writing: set[str]) -> None:
        """Put ``layout`` on the register; its shards take shard 0's flow state when it is
        new there or not the default (see engine.sharding.flow). A shard whose Redis cannot
        take the copy holds up no other: only a write to it (of ``writing``, the shards
        about to be written) fails, and only if the state is a pause or a rate, which no
        message may go around; the default it lacks (left over from a pause since
        resumed) could only hold its messages back until the next pause or resume."""
        added, state = self.base.add_layout(layout)
        if added or state != NO_FLOW:
            names = layout_names(layout)[1:]
            unreached: dict[str, Exception] = {}
            state = spread(
                self.base, state, lambda: {name: self._store(name) for name in names}, unreached
            )
            if not unreached:
                return
            failed = sorted(unreached)
            logger.warning(
                "queue %s: shard(s) %s of layout %d did not take the flow state: %s",
                self.keys.queue,
                ", ".join(failed),
                layout,
                unreached[failed[0]],
            )
            written = writing.intersection(unreached)
            if state != NO_FLOW and written:
                raise unreached[min(written)]

    def _refresh_registration(self, layout: int, now: float) -> None:
        """Put ``layout`` on the register again, in a thread of its own: waited for
        REGISTER_PATIENCE_SECONDS at the most, and not at all while refreshes fail (a
        hung shard 0 must not hold back writes to the other shards). One at a time, and
        not again before the backoff of one that failed."""
        with self._register_lock:
            under_way = self._registering.get(layout)
            # (is_alive: a thread copied by a fork is not running in the child.)
            if under_way is not None and under_way.is_alive():
                return
            retry_at = self._register_retry_at.get(layout)
            if retry_at is not None and now < retry_at:
                return
            thread = threading.Thread(
                target=self._register_again,
                args=(layout,),
                name=f"delayqueue-register-{self.keys.queue}-{layout}",
                daemon=True,
            )
            self._registering[layout] = thread
            thread.start()
        if retry_at is None:
            thread.join(REGISTER_PATIENCE_SECONDS)

    def _register_again(self, layout: int) -> None:
        started = time.monotonic()
        try:
            self._add_layout(layout, writing=set())
        except Exception as error:  # a background refresh: tried again, never raised
            self._register_retry_at[layout] = time.monotonic() + SHARD_RETRY_SECONDS
            outage = isinstance(error, RedisError | RedisClusterException | OSError)
            (logger.debug if outage else logger.warning)(
                "queue %s: registering layout %d failed: %r",
                self.keys.queue,
                layout,
                error,
                exc_info=not outage,
            )
            return
        self._register_retry_at.pop(layout, None)
        self._registered_at[layout] = started

    def retire(self, layout: int) -> dict[str, dict[str, int]]:
        """Take ``layout`` off the register if its shards hold nothing. Its shard 0 is every
        layout's: only the keyed messages there that no other layout's lookups would find
        hold the layout (all but those of keys whose shard of this store's layout, or of
        another on the register, is shard 0). Returns the shards that still hold messages,
        by name, with their counts: empty when the layout was retired."""
        if layout == self.layout:
            raise ValueError(f"layout {layout} is this queue's SHARDS: it cannot be retired")
        if not 0 < layout <= MAX_SHARDS:
            raise ValueError(f"{layout!r} is not a layout (1 to {MAX_SHARDS})")
        holding = {}
        for name in layout_names(layout)[1:]:
            stats = self._store(name).stats()
            if any(stats[count] for count in HELD):
                holding[name] = {count: stats[count] for count in HELD}
        stranded = self._stranded_keys(layout)
        if stranded:
            holding["0"] = {"keyed": stranded}
        if not holding:
            self.base.retire_layout(layout)
            self.refresh_layouts(force=True)
        return holding

    def _stranded_keys(self, layout: int) -> int:
        """How many keyed messages shard 0 holds that only ``layout``'s lookups would find:
        their key's shard of ``layout`` is shard 0, and of no layout that stays (this
        store's, the others on the register) is it."""
        self.refresh_layouts(force=True)
        staying = {*self._draining, self.layout} - {layout}
        if 1 in staying:  # every key's shard of layout 1 is shard 0
            return 0
        return sum(
            1
            for key in self.base.stored_keys()
            if key_shard(key, layout) == 0 and all(key_shard(key, other) != 0 for other in staying)
        )

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
