"""``ShardedStore``: one queue over many shards, each a whole queue to the scripts.

It implements the ``Store`` protocol over one store per shard (Redis or memory), so
``Queue``, the worker and the admin work on a sharded queue as on any other. What names a
message (send, cancel, ack, peek, requeue...) goes to the shard its id names, in one call
per shard it touches: atomic per shard, not across shards. Readers add the shards up:
``stats`` over the shards it can read, counting in ``shards_down`` those it cannot.

Keyed messages (issue #26) live on their key's shard (shards.key_shard), so in a steady
layout one call to one shard decides a keyed send, lookup, cancel or reschedule, atomically.
A batch's messages go to their shards in one call per shard, as send's do, those with an
``if_exists="error"`` message first: a DuplicateKey refusal refuses the part bound for its
shard and leaves the parts after it unsent, so a batch whose "error" messages are all on one
shard is refused whole; with such messages on several shards, the parts sent before the
refusing one stay written.

After SHARDS changed, a key's earlier message may still sit on the key's shard of an older
layout, and the rule that keeps one key in one place is:

- A key's *home* is the first of these shards that holds the key: a message with it (in
  any state: waiting, in flight or dead, as ``lookup`` answers), or a ``unique_for`` hold
  on it that lasts. They are the key's shard of each other layout on the register, in
  ascending order of their SHARDS (the register keeps no age), then its shard of the
  layout the message's id names (this store's, unless a relay writes what another process
  placed; an id of shard 0 names every layout, and counts as this store's). A key found
  nowhere lives on that last one. Layout 1 is on the register while keys sent under one
  shard may wait on shard 0 (engine.sharding.layouts), and its shard is shard 0 for every key.
- ``send_keyed`` asks the other layouts' shards first (one ``holds_key`` each, once per
  key and call; none at all while the register holds this layout only) and sends each
  message to its key's home, its id's suffix rewritten to name that shard when it names
  another (ids placed by shards.place with their keys name their key's shard already): the
  id a send returns is the one stored. There ``if_exists`` and ``unique_ms`` apply as on
  any store (a hold there holds the key, though its message has gone), and a message of
  the key in flight there is superseded on its return, as on one shard.
- ``lookup`` and ``reschedule(key=...)`` ask the same shards in the same order and stop at
  the first that answers; ``cancel_key`` asks every one of them, so that no waiting message
  of the key is left anywhere.

Its limits, while more than one layout is on the register: the rule is not atomic across
shards. Two senders racing on a key that none of the older layouts' shards holds (or one
racing with the last worker of the key's message there) can each create a message, on
different shards, and so can a sender that has not read the register since a new layout
joined it (it reads it every LAYOUTS_RECHECK_SECONDS). A keyed message relayed from a
database outbox goes to the shard its id names (its key's shard of the layout that placed
it, where the relay's guard against writing it twice is kept) and is decided there alone.
Retiring a layout ends the holds on its shards (a hold is no message: ``retire`` does not
count them). Once the older layouts are retired, a key is one shard's again.

The store is composed of its parts: the shards and their layouts (engine.sharding.layouts),
fetching by plan (engine.sharding.fetch, with engine.sharding.wakeups) and the readers that add
the shards up (engine.sharding.reads); what stays here routes each call by the ids it names.
"""

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.protocol import ShardStore, Store
from delayqueue_django.engine.records import (
    BURY,
    Attempt,
    Attempts,
    KeyedSent,
    NackOutcome,
    NewMessage,
    ScheduleFailure,
    ScheduleListing,
    ScheduleRecord,
    ScheduleReply,
    StoredMessage,
    Tick,
)
from delayqueue_django.engine.sharding.fetch import ShardFetching
from delayqueue_django.engine.sharding.flow import spread
from delayqueue_django.engine.sharding.placement import (
    SHARD_MARK,
    key_shard,
    layout_names,
    parse_name,
    place,
    shard_name,
    shard_of,
    with_shard,
)
from delayqueue_django.engine.sharding.reads import ShardReads
from delayqueue_django.engine.sharding.wakeups import ShardedWakeups

T = TypeVar("T")

logger = logging.getLogger("delayqueue_django.engine")


class ShardedStore(ShardFetching, ShardReads):
    """A queue spread over the shards of ``layout`` (see engine.sharding.placement), which also
    reads and drains the shards of the other layouts registered on shard 0. A store of layout
    1 is an unsharded queue that still finds, drains and lists what an earlier layout left."""

    # Where messages go

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """Each new id with a shard of this layout (see shards.place)."""
        return place(message_ids, self.layout, keys)

    def shard_for(self, message_id: str) -> ShardStore:
        """The store of the shard an id names (of any layout)."""
        return self._store(shard_name(*shard_of(message_id)))

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
        single: bool = False,
        ahead: Callable[[T], bool] | None = None,
    ) -> list[Any]:
        """``call`` once per shard with its items; the replies back in the items' order
        (each reply has one entry per item). ``register``: writes that make messages, whose
        layouts go on the register first (with layout 1 if ``single``, see
        ShardLayouts._register). ``ahead``: the items whose shards are called first (the
        shards otherwise in order of their first item)."""
        groups = self._group(id_of(item) for item in items)
        if register:
            self._register(groups, single=single)
        if ahead is not None and len(groups) > 1:
            groups = dict(
                sorted(
                    groups.items(),
                    key=lambda group: not any(ahead(items[i]) for i in group[1]),
                )
            )
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
        if self.layout == 1 and len(messages) == 1 and SHARD_MARK not in messages[0].id:
            # A queue of one shard sending one message of shard 0, as a send per message
            # does: straight there (_per_shard would register no layout, see _register).
            return self.shards["0"].send(messages)
        return self._per_shard(
            messages, _message_id, lambda store, part: store.send(part), register=True
        )

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        groups = self._group(message.id for message in messages)
        self._register(groups, single=any(map(self._relayed_as_single, messages)))
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

    # Keyed messages (see the module's docstring: a key's home)

    def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        homed = self._homed(messages)
        # The parts that may be refused go first: when they are all on one shard, as one
        # key's are, a refusal leaves the whole batch unwritten.
        return self._per_shard(
            homed,
            _message_id,
            lambda store, part: store.send_keyed(part),
            register=True,
            # Keys sent under one shard while other layouts are registered: those layouts'
            # processes must look for them on shard 0 (see a key's home).
            single=self.layout == 1 and bool(self._draining),
            ahead=_may_refuse,
        )

    def _relayed_as_single(self, message: NewMessage) -> bool:
        """Whether a relayed message is a keyed one bound for shard 0 as a message of layout
        1: relayed by a store of one shard while other layouts are registered, or placed
        there by a process of one shard (its key's shard of this layout is another)."""
        if message.key is None or shard_of(message.id) != (1, 0):
            return False
        if self.layout == 1:
            return bool(self._draining)
        return key_shard(message.key, self.layout) != 0

    def lookup(self, key: str) -> StoredMessage | None:
        for name in self._key_shards(key, self.layout):
            found = self._store(name).lookup(key)
            if found is not None:
                return found
        return None

    def cancel_key(self, key: str) -> str | None:
        removed = [self._store(name).cancel_key(key) for name in self._key_shards(key, self.layout)]
        return next((message_id for message_id in removed if message_id is not None), None)

    def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        if key is None:
            if message_id is None:
                raise ValueError("reschedule: give a message_id or a key")
            return self.shard_for(message_id).reschedule(
                message_id=message_id, at_ms=at_ms, delay_us=delay_us
            )
        if message_id is not None:
            raise ValueError("reschedule: give a message_id or a key, not both")
        for name in self._key_shards(key, self.layout):
            due_ms = self._store(name).reschedule(key=key, at_ms=at_ms, delay_us=delay_us)
            if due_ms is not None:
                return due_ms
        return None

    def _key_shards(self, key: str, layout: int) -> list[str]:
        """The shards ``key`` may live on, in the order its home is looked for: its shard
        of each other layout on the register (by ascending SHARDS), then its shard of
        ``layout``; each named once (shard 0 is every layout's)."""
        self.refresh_layouts()
        others = sorted({*self._draining, self.layout} - {layout})
        names: list[str] = []
        for each in (*others, layout):
            name = shard_name(each, key_shard(key, each))
            if name not in names:
                names.append(name)
        return names

    def _homed(self, messages: Sequence[NewMessage]) -> list[NewMessage]:
        """``messages``, those whose id names another shard than their key's home with the
        id rewritten to name it (each key's home looked for once)."""
        self.refresh_layouts()
        # One shard and no other layout: every key's home is shard 0, whose ids name no shard
        # (the common case, spared a home looked for per key).
        if (
            self.layout == 1
            and not self._draining
            and all(
                message.key is not None and SHARD_MARK not in message.id for message in messages
            )
        ):
            return list(messages)
        homes: dict[tuple[str, int], str] = {}
        homed = []
        for message in messages:
            if message.key is None:
                raise ValueError(f"send_keyed: message {message.id!r} has no key")
            if message.group is not None and self.layout > 1:
                # Its key's shard is not its group's (Queue refuses it: check_key_and_group).
                raise ValueError(
                    f"send_keyed: message {message.id!r} has a key and a group, which a "
                    f"layout of {self.layout} shards cannot keep on one shard"
                )
            named = shard_of(message.id)
            # An id of shard 0 names no layout in particular (shard 0 is every layout's).
            layout = self.layout if named == (1, 0) else named[0]
            home = homes.get((message.key, layout))
            if home is None:
                home = homes[message.key, layout] = self._home(message.key, layout)
            moved = home != shard_name(*named)
            homed.append(
                dataclasses.replace(message, id=with_shard(message.id, *parse_name(home)))
                if moved
                else message
            )
        return homed

    def _home(self, key: str, layout: int) -> str:
        """The first of ``key``'s shards of the other layouts on the register that holds
        it (a message with it, or a unique_for hold), else its shard of ``layout``."""
        *others, own = self._key_shards(key, layout)
        for name in others:
            if self._store(name).holds_key(key):
                return name
        return own

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        removed = self.shard_for(message_id).remove(
            message_id,
            include_in_flight_and_dead=include_in_flight_and_dead,
            only_from=only_from,
        )
        if removed == "unack":
            # Deleted in flight: it holds the cap's slot no more, as an ack frees it.
            self._free_slots([message_id])
        return removed

    # Consumers

    def ack(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        fetcher: str = "",
        request: str = "",
        plain: bool = False,
        untracked: bool = False,
    ) -> set[str]:
        acked: set[str] = set()
        for name, positions in self._group(message_id for message_id, _ in leases).items():
            part = [leases[i] for i in positions]
            acked |= self._store(name).ack(
                part, fetcher=fetcher, request=request, plain=plain, untracked=untracked
            )
        self._free_slots(acked)
        return acked

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
        postponed: Collection[str] = (),
        max_postpones: int = 0,
        attempts: Mapping[str, AttemptNote] | None = None,
    ) -> list[NackOutcome]:
        outcomes: list[NackOutcome] = self._per_shard(
            refusals,
            _refusal_id,
            lambda store, part: store.nack(
                part,
                fetcher=fetcher,
                request=request,
                postponed=postponed,
                max_postpones=max_postpones,
                attempts=attempts,
            ),
        )
        self._free_slots([outcome.id for outcome in outcomes if outcome is not None])
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
        self._free_slots(released)
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
        if self._capped() and extended:
            self._on_shard_0("extending the slots of", lambda: self.base.extend_slots(extended))
        # The earliest: no delivery is told it holds longer than its shard keeps it.
        return min(deadlines), extended

    # A sharded queue's cap (see engine.flow): its slots on shard 0 follow the deliveries.

    def _capped(self) -> bool:
        return self.limits.max_in_flight > 0 and len(self._order) > 1

    def _free_slots(self, ids: Collection[str]) -> None:
        """The slots of deliveries their shards acked, refused or released: freed."""
        if self._capped() and ids:
            self._on_shard_0("freeing the slots of", lambda: self.base.free_slots(list(ids)))

    def _on_shard_0(self, what: str, call: Callable[[], int]) -> None:
        """A call on the slots, after the shards did their part: shard 0 not answering
        fails it alone (the slots then hold until their leases would run out)."""
        try:
            call()
        except (RedisError, OSError) as error:
            logger.warning(
                "queue %s: %s deliveries on shard 0 failed (%s); their slots free "
                "themselves when their leases run out",
                self.keys.queue,
                what,
                error,
            )

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        confirmed = 0
        for name, positions in self._group(message_id for message_id, _ in claims).items():
            confirmed += self._store(name).confirm_exhausted([claims[i] for i in positions])
        return confirmed

    def flow(self, action: str = "read", rate: tuple[int, int] | None = None) -> FlowState:
        """Shard 0's flow state, after ``action``: shard 0 holds the queue's (and its
        budget), and a change is copied to every other shard, those of each layout on the
        register as read after it (see engine.sharding.flow). A read asks shard 0 only. A
        shard whose Redis fails keeps none of the others from their copy; its error is
        raised after them (call it again once that shard is back)."""
        state = self.base.flow(action, rate)
        if action == "read":
            return state
        if action == "rate":
            self._run_time_rate = rate is not None
        unreached: dict[str, Exception] = {}
        spread(self.base, state, self._copies, unreached)
        if unreached:
            raise unreached[min(unreached)]
        return state

    def _copies(self) -> dict[str, ShardStore]:
        """Every shard but shard 0 of this store's layout and of each on the register, as
        read now: a layout registered before a change must get it."""
        self.refresh_layouts(force=True)
        return {name: store for name, store in self.consumed().items() if name != "0"}

    def subscribe_wakeups(self) -> "ShardedWakeups":
        return ShardedWakeups(self)

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

    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        return self.shard_for(message_id).peek(message_id, preview_bytes=preview_bytes)

    def peek_payload(self, message_id: str) -> bytes | None:
        return self.shard_for(message_id).peek_payload(message_id)

    def held(self, message_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for name, positions in self._group(message_ids).items():
            found |= self._store(name).held([message_ids[i] for i in positions])
        return found

    def history(self, message_id: str) -> Attempts:
        return self.shard_for(message_id).history(message_id)

    def last_errors(self, message_ids: Sequence[str]) -> dict[str, Attempt]:
        found: dict[str, Attempt] = {}
        for name, positions in self._group(message_ids).items():
            found |= self._store(name).last_errors([message_ids[i] for i in positions])
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


def parts(store: Store) -> dict[str, ShardStore]:
    """A queue's stores that each hold one set of keys, by shard name: every shard of a
    sharded queue, else the store itself as shard "0"."""
    if isinstance(store, ShardedStore):
        return store.consumed()
    return {"0": store}  # type: ignore[dict-item]  # every unsharded store is a ShardStore


def _message_id(message: NewMessage) -> str:
    return message.id


def _refusal_id(refusal: tuple[str, int, int]) -> str:
    return refusal[0]


def _may_refuse(message: NewMessage) -> bool:
    return message.if_exists == "error"


__all__ = [
    "ShardedStore",
    "ShardedWakeups",
    "layout_names",
    "parts",
]
