"""What a queue needs from the place its messages live: the ``Store`` protocol.

``RedisStore`` (the Lua scripts) and ``MemoryStore`` (the same life cycle in this process)
both implement it; ``Queue``, the worker and the admin depend only on it, so the two can never
drift apart in signature. Their behaviour is held together by the engine's contract tests,
which run against both.
"""

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from delayqueue_django.engine.flow import GATES_OWN, FlowState, Reservation
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.records import (
    Attempt,
    Attempts,
    ExhaustedClaim,
    FetchResult,
    KeyedSent,
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


class WakeupSubscription(Protocol):
    """A listener on a queue's wake-ups: work came due earlier than sleeping workers planned."""

    def wait(self, timeout: float) -> int | None:
        """Block until the next wake-up and return the due time it announced (ms), or None
        when ``timeout`` seconds pass without one."""

    def close(self) -> None: ...


class ChannelSubscription(WakeupSubscription, Protocol):
    """A listener on several wake-up channels (a sharded queue's, one per shard)."""

    def wait_on(self, timeout: float) -> tuple[str, int] | None:
        """``wait``, telling on which channel the wake-up came: ``(channel, due_ms)``."""


class Store(Protocol):
    """One queue's state. Every method is one atomic step (on a sharded queue, one atomic
    step per shard it touches: see engine.sharding.store)."""

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """New ids as this store files them: a sharded store appends each one's shard (a
        keyed id's from its key: ``keys``, one per id, None for an id without one)."""

    @property
    def keys(self) -> QueueKeys: ...

    @property
    def limits(self) -> StoreLimits: ...

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages; returns each one's due time in ms (the store's clock).
        Raises DuplicateMessageId, writing nothing of that batch, if an id is known."""

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        """Write messages relayed from a database outbox (each with its ``at_ms``), each at
        most once: an id relayed before, and not forgotten since, or already known to the
        queue, is not written again (its entry in the reply is None, the others their due
        times). A keyed message (``if_exists`` keep or replace, never error) is decided as
        ``send_keyed`` decides it, in order: kept or held, it writes nothing (None); a
        replace answers the replaced message's new due time. One with its ``outbox_row``
        is decided in its rows' order, however late it comes: a replace row older than one
        of its database that created or replaced the key's waiting message keeps it
        (None). ``forget``: ids relayed before
        whose outbox rows are now deleted for good; an id never forgotten is forgotten
        ``keep_ms`` after its relay."""

    def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        """Schedule messages that each carry a key, applying each one's ``if_exists`` and
        ``unique_ms`` against the key's waiting message and hold (see engine/keyed.py and
        send_keyed.lua), in order, each seeing the earlier ones. Raises DuplicateKey,
        writing nothing of that batch, when an ``if_exists="error"`` message meets one."""

    def lookup(self, key: str) -> StoredMessage | None:
        """The key's message (its waiting one, else the latest sent with it while that is
        still stored: in flight or dead), or None when the key names nothing stored."""

    def cancel_key(self, key: str) -> str | None:
        """Remove the key's message if it is waiting; returns its id, or None."""

    def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        """Give a waiting message (by id, or the key's) a new due time: ``at_ms``, or
        ``delay_us`` from the store's clock rounded up to the ms. Returns the new due time,
        or None when no message waits under that id or key (nothing changed)."""

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        """Remove a message; returns the state it left, or None if nothing was removed.
        With ``only_from``, only a message in that state is removed."""

    # Consumers

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        """Hand out up to ``count`` due messages, leased until now + consume_ms.

        A fetch that repeats ``request``, the id of the ``fetcher``'s last fetch, hands out
        again what that fetch took (its reply was lost), with new leases and the same
        attempts, and takes nothing new.
        """

    def flow(self, action: str = "read", rate: tuple[int, int] | None = None) -> FlowState:
        """The queue's flow state (see engine.flow), after ``action``: "read" changes
        nothing; "pause" has fetches hand out nothing until "resume", which wakes the
        workers; "rate" sets the rate limit ``(limit, period_ms)`` that overrides the
        store's limits, or with None goes back to them (a sharded store changes shard 0,
        which keeps the whole queue's budget, and its other shards copy it: see
        engine.sharding.flow)."""

    def ack(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        fetcher: str = "",
        request: str = "",
        plain: bool = False,
        untracked: bool = False,
    ) -> set[str]:
        """Forget delivered messages; returns the ids whose lease still held. ``plain``:
        the caller knows none was sent with a key, so the store need not look for keys;
        ``untracked``: none was handed out while the queue had expiries or postpone
        counts (``Delivery.tracked``), so the store need not look for those.

        A ``fetcher`` may name each ack or nack ``request``: the store keeps the reply of
        the fetcher's last one that changed something (for consume_ms), and a call that
        repeats it (its reply was lost) changes nothing and gets that reply again.
        """

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
        """Refuse deliveries: ``(id, lease, delay_ms)``; delay ``BURY`` buries at once.
        A repeated ``request`` gets the reply it had (see ack). The ids in ``postponed``
        are postponed: their attempt is not counted nor their budget checked, and one
        postponed more than ``max_postpones`` times is buried with the reason
        POSTPONED_TOO_OFTEN. A retry or postpone due at or after the message's expiry
        buries it with the reason EXPIRED. ``attempts``: the note of each refused id's
        attempt, written as its attempt record in the same step (at most
        ``limits.history_attempts`` a message, the newest kept; see engine.history)."""

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        """Hand back deliveries that were never started, without using a retry."""

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        """Push deadlines to now + consume_ms; returns the new deadline and the ids extended."""

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """Claim exhausted messages whose announcement is owed (see confirm_exhausted)."""

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        """Record that claimed exhaustions were announced: ``(id, claimed_until_ms)`` of each
        claim. An id whose claim lapsed and was taken again, or whose message was exhausted
        anew since, is left for that newer claim. Returns how many were confirmed."""

    def subscribe_wakeups(self) -> WakeupSubscription:
        """Listen to the queue's wake-ups; the subscription is active when this returns."""

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        """Move dead letters back to pending, due now, with a fresh retry budget."""

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        """Make pending messages due now."""

    def drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        limit: int,
        keep_unannounced: bool,
        offset: int = 0,
        buried_before_ms: int | None = None,
    ) -> tuple[int, int]:
        """Delete dead letters (all, or buried at least older_than_ms ago), oldest first,
        examining at most ``limit`` after passing over the oldest ``offset`` candidates (those
        earlier calls kept). With ``keep_unannounced``, one whose exhaustion is still to be
        announced is kept. With ``buried_before_ms`` (the store's clock), instead of
        ``older_than_ms``, only those buried before that time are candidates. Returns how
        many were deleted and how many kept: fewer than ``limit`` in all means no candidate
        is left."""

    def stats(self) -> dict[str, int]: ...

    def throughput(self, minutes: int) -> list[tuple[int, int, int]]:
        """``(minute_start_ms, acked, failed)`` for the last ``minutes`` minutes, oldest first."""

    def prune_throughput(self, keep_minutes: int) -> int:
        """Forget per-minute counts older than ``keep_minutes``; returns how many."""

    def add_totals(self, increments: Mapping[str, int]) -> None:
        """Add worker-measured counts to the queue's running totals."""

    def totals(self) -> dict[str, int]:
        """Every running total, by name: the store's own and those added by workers."""

    def list(
        self, state: str, *, offset: int, limit: int, preview_bytes: int
    ) -> list[StoredMessage]:
        """One page of the messages in ``state``, in queue order."""

    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it; its
        payload cut to at most ``preview_bytes`` bytes, as ``list`` cuts, if that is given."""

    def peek_payload(self, message_id: str) -> bytes | None:
        """A message's whole payload, the very bytes stored (without the trace context a
        traced send put before them), or None if it has none."""

    def held(self, message_ids: Sequence[str]) -> set[str]:
        """Those of these messages the queue still holds, in any state (dead letters too):
        those not yet acked, removed or dropped. One round trip per shard."""

    def history(self, message_id: str) -> Attempts:
        """The message's attempt records, oldest first ([] when it has none). A damaged
        record reads as an Attempt whose ``damaged`` says why; nothing here raises for it."""

    def last_errors(self, message_ids: Sequence[str]) -> dict[str, Attempt]:
        """The newest attempt record of each of these messages that has one, by id. One
        round trip per shard."""

    # Schedules (delayqueue_django.schedules; the semantics are schedule.lua's)

    def read_schedules(self) -> ScheduleListing:
        """The store's clock (ms) and every schedule, by name, read atomically."""

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        """One schedule as it stands, None if the store has neither its definition nor its
        tick record."""

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        """Write the schedule's tick, only if it is later than its cursor and the schedule
        still has this fingerprint and is not paused: each tick time is written once."""

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
        """Add or change a schedule (``expect``: "any", "new" or "existing"). A changed one
        loses its waiting tick, owes no tick up to ``start_ms`` and gets ``first``."""

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        """Pause a schedule: its waiting tick (and the one before, if it still waits) is
        removed and none is written; the others still waiting are dropped by workers as
        they are handed out (see ``ScheduleRunner.declines``)."""

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        """Resume a paused schedule from ``start_ms`` (its ``since``: ticks written before
        are not run), with ``first`` as its next tick; "stale" (still paused) if its
        definition is not the one of ``fingerprint``."""

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        """Remove a schedule (only with this fingerprint, if given) and its waiting tick
        (and the one before, if it still waits); the others still waiting are dropped by
        workers as they are handed out."""

    def declare_schedule(self, name: str) -> ScheduleReply:
        """Record that a worker has the schedule in its settings, now ("declared"); nothing
        if the store has no such schedule ("missing")."""

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        """Remove the schedule (only with this fingerprint, if given), as
        ``remove_schedule`` does, if no worker has declared it for ``undeclared_ms``
        ("removed"); else "declared" (one never declared counts as declared now)."""

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        """Record why a worker cannot write the ticks of the schedule of this fingerprint
        (read back with it); "stale" or "missing" if it has another one or none. Kept until
        a tick of it is written, or it is changed or removed."""

    # Task results (delayqueue_django.tasks)

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        """Set ``fields`` of a task's result record, and ``unless_set`` only where absent;
        keep it ``ttl_seconds`` from now (None: until deleted); return the whole record."""

    def read_result(self, result_id: str) -> dict[str, str]:
        """A task's result record; empty if there is none (or it expired)."""

    # Worker heartbeats

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        """Publish a worker's details (JSON) until ``ttl_ms`` from now."""

    def drop_heartbeat(self, worker_id: str) -> None: ...

    def heartbeats(self) -> dict[str, str]:
        """The details of every worker whose heartbeat has not expired, by id."""


class ShardStore(Store, Protocol):
    """A store that holds one set of keys (a queue, or one shard of a sharded queue): what
    the invariant checker reads, and what a sharded store is made of."""

    def fetch(
        self,
        count: int,
        *,
        fetcher: str = "",
        request: str = "",
        gates: str = GATES_OWN,
        leased_from: int | None = None,
        gated: bool = False,
    ) -> FetchResult:
        """As ``Store.fetch``; ``gates``: how the flow gates apply, on a shard of a sharded
        queue (engine.flow's GATES_*), ``leased_from``: from when the leases run (ms),
        a reservation's time, if not now, and ``gated``: the reservation bound ``count``
        (handing all of it out then wakes no idle peer: the rest waits for the gates)."""
        ...

    def copy_flow(self, state: FlowState) -> None:
        """Take shard 0's flow ``state``: paused or not, and the whole queue's rate set at
        run time noted (a shard of a sharded queue but shard 0, which enforces no rate of
        its own; see engine.sharding.flow). Lifting a pause or changing the rate wakes the
        workers, as resume does."""
        ...

    # A sharded queue's budget for the whole queue, on shard 0 (see engine.flow)

    def reserve(self, count: int, name: str) -> Reservation:
        """Reserve up to ``count`` hand-outs, as entries named after ``name``: a repeat of
        a call whose reply was lost reserves the same ones again."""
        ...

    def settle(
        self, name: str, reserved: int, used: int, ids: Sequence[str], beyond: int = 0
    ) -> None:
        """After the shards answered: give back the ``reserved - used`` hand-outs not used
        (``used`` counts those a shard whose reply was lost may have handed out), log the
        ``beyond`` handed out past the reservation (a repeat's), and turn the first
        ``len(ids)`` reserved slots into those of ``ids`` (the deliveries, under a cap),
        the rest of the ``used`` ones kept (see flow_settle.lua)."""
        ...

    def free_slots(self, ids: Sequence[str]) -> int:
        """Free the slots of deliveries acked, refused or released; returns how many."""
        ...

    def extend_slots(self, ids: Sequence[str]) -> int:
        """Hold the slots of deliveries whose leases were extended until now + consume_ms."""
        ...

    def snapshot(self) -> list[Any]:
        """Every id the queue holds, read atomically, for the invariant checker."""
        ...

    def unreadable_payloads(self) -> list[Any]:
        """The ids, as read, of the payloads that are not UTF-8 text (only a foreign write
        stores such), for the invariant checker."""
        ...

    def subscribe_channels(self, channels: Sequence[str]) -> ChannelSubscription:
        """Listen on several wake-up channels of this store's server, in one subscription."""
        ...

    def server_name(self) -> str:
        """Which server holds this store's keys, as this process sees it now: stores of the
        same name share one, and a server that does not answer fails them all alike."""
        ...

    def layouts(self) -> set[int]:
        """The layouts registered as possibly holding messages: on shard 0 only (see
        engine.sharding.layouts). SHARDS of 2 or more, and 1 while keys sent under one shard
        may wait on shard 0."""
        ...

    def add_layout(self, layout: int) -> tuple[bool, FlowState]:
        """Register a layout before writing to its shards (shard 0 only). One new on the
        register is announced on the wake-up channel as a due time of LAYOUTS_CHANGED, in
        the same atomic step: never one without the other. The first on an empty register
        brings layout 1 with it when the queue has had a keyed message (add_layout.lua).
        Returns whether it was new there, and the flow state as the registration left it
        (read in the same step), which the layout's shards take (engine.sharding.flow)."""
        ...

    # Keys across layouts (engine.sharding.store: a key's home)

    def holds_key(self, key: str) -> bool:
        """Whether the key is this shard's: a message with it is stored here (in any state,
        as ``lookup`` finds one), or a unique_for hold on it lasts."""
        ...

    def keys_used(self) -> bool:
        """Whether this shard has ever had a keyed message (its key index exists)."""
        ...

    def stored_keys(self) -> Iterator[str]:
        """The key of every keyed message stored here (the key index), read a page at a
        time."""
        ...

    def retire_layout(self, layout: int) -> bool:
        """Take a drained layout off the register (shard 0 only); False if it was not on it."""
        ...
