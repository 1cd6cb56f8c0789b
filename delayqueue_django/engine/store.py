"""The store: one queue's state in Redis, changed only through the Lua scripts.

Every public method is one round trip (a bulk send on Redis Cluster is one per chunk) and
one atomic step per script call; no client-side locks, so any number of producers and
consumers may share a queue.
"""

import logging
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import OutOfMemoryError, RedisClusterException, ResponseError

from delayqueue_django.engine.errors import (
    DuplicateMessageId,
    RedisOutOfMemory,
    UnsupportedRedisVersion,
    expiry_refusal,
)
from delayqueue_django.engine.expiry_calls import expiry_args, postpone_args
from delayqueue_django.engine.flow import (
    GATES_OWN,
    FlowState,
    Reservation,
    parse_rate_wire,
    rate_wire,
)
from delayqueue_django.engine.keyed import KEY_MARK, check_relayable, split_keyed
from delayqueue_django.engine.keyed_calls import (
    cancel_key_args,
    cancelled_id,
    duplicate_key,
    keyed_sent,
    reschedule_args,
    rescheduled_due,
    send_keyed_calls,
    wire,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.pubsub import RedisWakeups
from delayqueue_django.engine.records import (
    EXPIRED,
    LONGEST_FAILURE_REASON,
    POSTPONED_TOO_OFTEN,
    STATES,
    Delivery,
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
    loggable,
    meta_numbers,
    parse_schedule_record,
    split_trace,
)
from delayqueue_django.engine.scripts import Lua
from delayqueue_django.engine.sharding.placement import LAYOUTS_CHANGED

logger = logging.getLogger("delayqueue_django.engine")

RedisClient: TypeAlias = Redis | RedisCluster

# Functions (FUNCTION LOAD, FCALL) arrived in Redis 7.0; Valkey, which has them from its
# first release, 7.2, reports itself as that Redis version.
MINIMUM_REDIS_VERSION = (7, 0)


# Replies are bytes. What the package wrote itself is UTF-8 text; but anyone can write to a
# queue's keys, and bytes that are not UTF-8 in an id, payload or meta record must cost that
# message alone, never the reader (a fetch's whole batch, an admin page).


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _flow_state(paused: int, rate_text: bytes | str) -> FlowState:
    """The flow state as flow.lua and add_layout.lua answer it."""
    return FlowState(bool(int(paused)), parse_rate_wire(_text(rate_text)))


def _id(value: bytes | str) -> str:
    """An id as stored: bytes that are not UTF-8 become surrogate escapes (see keyed_calls.wire)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _shown(value: bytes | str) -> str:
    """Text to look at: bytes that are not UTF-8 as backslash escapes ("\\xff")."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _optional_shown(value: bytes | str | None) -> str | None:
    return None if value is None else _shown(value)


def _payload_text(value: bytes | str | None) -> str | None:
    """A payload's text; None if it is missing or not UTF-8 text."""
    try:
        return None if value is None else _text(value)
    except UnicodeDecodeError:
        return None


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def parse_meta(raw: str | None) -> tuple[int, int, int] | None:
    """Lease, attempt and budget from ``"lease:attempt:budget:due"``, or None when the
    record is missing or damaged. (A record from before ``due`` was kept has 3 fields.)"""
    if raw is None:
        return None
    parts = raw.split(":")
    numbers = meta_numbers(parts) if len(parts) in (3, 4) else None
    if numbers is None:
        return None
    lease, attempt, budget = numbers[:3]
    return lease, attempt, budget


# Shared by the sync and async stores: building script arguments and reading replies.


def oldest_version(info: dict[str, Any]) -> tuple[int, ...]:
    """The server's version from INFO server; on a cluster, the oldest node's."""
    if "redis_version" in info:
        versions = [info["redis_version"]]
    else:  # RedisCluster answers with one dict per node.
        versions = [node["redis_version"] for node in info.values() if isinstance(node, dict)]
    return min(tuple(int(part) for part in str(v).split(".")[:3]) for v in versions)


def require_supported(version: tuple[int, ...], queue: str) -> None:
    if version < MINIMUM_REDIS_VERSION:
        found = ".".join(map(str, version))
        needed = ".".join(map(str, MINIMUM_REDIS_VERSION))
        raise UnsupportedRedisVersion(
            f"delayqueue_django needs Redis {needed} or newer; queue {queue!r} is on Redis {found}"
        )


def log_warnings(queue: str, warnings: Sequence[Sequence[bytes | str]]) -> None:
    """The scripts' warnings: their subjects (an id, a key) and reasons (naming a field, a
    schedule) are read from Redis, where anyone may have written them."""
    for subject, reason in warnings:
        logger.warning(
            "damaged queue state queue=%s subject=%s: %s",
            queue,
            loggable(_shown(subject)),
            loggable(_shown(reason)),
        )


def send_calls(channel: str, messages: Sequence[NewMessage], batch_size: int) -> list[list[Any]]:
    """The send script's ARGV for each chunk of ``batch_size`` messages."""
    calls = []
    for chunk in _chunks(messages, batch_size):
        args: list[Any] = [channel, len(chunk)]
        grouped: list[Any] = []
        expiring = False
        for index, message in enumerate(chunk, start=1):
            at = "" if message.at_ms is None else message.at_ms
            args += [message.id, at, message.delay_us, message.budget, message.payload]
            if message.group is not None:
                grouped += [index, wire(message.group)]
            if message.expires_at_ms is not None or message.expires_in_us:
                expiring = True
        # The groups' count and pairs first, then (only when one expires) the expiries.
        args += [len(grouped) // 2, *grouped]
        calls.append(args + expiry_args(chunk) if expiring else args)
    return calls


def relay_calls(
    channel: str,
    messages: Sequence[NewMessage],
    forget: Sequence[str],
    keep_ms: int,
    batch_size: int,
) -> list[list[Any]]:
    """The relay script's ARGV for each chunk of ``batch_size`` messages; the first call
    carries the ids to forget (and is made for them alone when there is no message)."""
    chunks = list(_chunks(messages, batch_size)) or [[]]
    calls = []
    for number, chunk in enumerate(chunks):
        forgotten = forget if number == 0 else ()
        args: list[Any] = [channel, keep_ms, len(chunk), len(forgotten)]
        rows: list[Any] = []
        for place, message in enumerate(chunk, start=1):
            if message.at_ms is None:
                raise ValueError(f"a relayed message needs its due time (id {message.id!r})")
            check_relayable(message)
            args += [message.id, message.at_ms, message.budget, message.payload]
            if message.key is None:
                args += ["", "", 0]
            else:
                args += [wire(message.key), message.if_exists, message.unique_ms]
                if message.outbox_row is not None:
                    rows += [place, wire(message.outbox_row[0]), message.outbox_row[1]]
            args.append("" if message.group is None else wire(message.group))
        args += forgotten
        # The expiries, then (only when a keyed message carries its row) the rows.
        tail = expiry_args(chunk)
        if rows:
            tail = [*(tail or [0]), len(rows) // 3, *rows]
        calls.append(args + tail)
    return calls


def send_error(error: ResponseError, queue: str) -> Exception:
    """The send script's refusals as the package's exceptions; any other error as it is."""
    refused_expiry = expiry_refusal(str(error), queue)
    if refused_expiry is not None:
        return refused_expiry
    if str(error).startswith("DUPLICATE "):
        return DuplicateMessageId(
            f"message id {str(error).split(' ', 1)[1]!r} already exists in queue {queue!r}; "
            "nothing in its batch was written"
        )
    if isinstance(error, OutOfMemoryError):
        # Redis refuses a script's first write when over maxmemory; a send's first write
        # is its first message, so nothing of the batch was written.
        return RedisOutOfMemory(
            f"Redis is out of memory and refused messages for queue {queue!r}; nothing in "
            "their batch was written. It is over its maxmemory with the noeviction policy: "
            "let workers drain queues, or give Redis more memory. "
            f"({error})"
        )
    return error


# nack.lua's codes of a burial, by the reason they give it.
_BURIAL_REASONS = {2: "", 4: EXPIRED, 5: POSTPONED_TOO_OFTEN}


def nack_outcomes(flat: Sequence[Any]) -> list[NackOutcome]:
    """nack.lua's outcomes (id, code, time per refusal) as NackOutcome."""
    outcomes = []
    for i in range(0, len(flat), 3):
        code = int(flat[i + 1])
        outcomes.append(
            NackOutcome(
                _id(flat[i]),
                code in _BURIAL_REASONS,
                int(flat[i + 2]),
                superseded=code == 3,
                dead_reason=_BURIAL_REASONS.get(code, ""),
            )
        )
    return outcomes


def removed_state(reply: Sequence[Any]) -> str | None:
    return _text(reply[0]) or None


STATS_NAMES = (
    *("pending", "ready", "unack", "retry", "garbage", "due", "unannounced"),
    *("server_time_ms", "next_due_ms", "lag_ms"),
    # Running totals since the queue began (they add up across workers).
    *("acked_total", "failed_total", "retried_total", "timed_out_total", "exhausted_total"),
    "superseded_total",
    *("expired_total", "postponed_total"),
    # 1 while the queue is paused (flow gates).
    "paused",
)


def parse_stats(reply: Sequence[Any]) -> dict[str, int]:
    return {name: int(value) for name, value in zip(STATS_NAMES, reply[:-1], strict=True)}


class RedisStore:
    """One queue's state in Redis."""

    def __init__(self, client: RedisClient, keys: QueueKeys, limits: StoreLimits) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        self._layout = keys.layout
        self._channel = keys.wakeup_channel
        self._lua = Lua(client)
        self._version_checked = False
        self._version_lock = threading.Lock()

    def server_name(self) -> str:
        if not isinstance(self.client, RedisCluster):
            return f"client {id(self.client)}"  # one server, or Sentinel's current master
        # The slot's node unknown for now: a server of its own.
        return self.cluster_master() or f"slot of {self.keys.tag}"

    def cluster_master(self) -> str:
        """``host:port`` of the Redis Cluster master holding this store's keys, as the client
        last learned the cluster's slots (no round trip); "" off Redis Cluster, or when no
        master is known to hold them."""
        if not isinstance(self.client, RedisCluster):
            return ""
        nodes: Any = self.client  # (redis-py's cluster methods are untyped)
        try:
            return str(nodes.get_node_from_key(self.keys.tag).name)
        except RedisClusterException:  # its slot is covered by no master
            return ""

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    @property
    def uses_scripts(self) -> bool:
        """Whether the Lua runs as EVALSHA scripts: the server refused Functions."""
        return self._lua.uses_scripts

    def check_server(self) -> None:
        """Refuse a Redis too old for the scripts (asked once per store)."""
        if self._version_checked:
            return
        with self._version_lock:
            if self._version_checked:
                return
            require_supported(oldest_version(self.client.info("server")), self.keys.queue)
            self._version_checked = True

    def _run(self, name: str, args: Sequence[Any], extra_keys: Sequence[str] = ()) -> Any:
        self.check_server()
        keys = [*self._layout, *extra_keys] if extra_keys else self._layout
        reply = self._lua(name, keys, args)
        log_warnings(self.keys.queue, reply[-1])
        return reply

    def place(self, message_ids: list[str], keys: Sequence[str | None] | None = None) -> list[str]:
        """New ids as this store files them: as they are (one queue, one set of keys)."""
        return message_ids

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages; returns each one's due time in ms (server clock)."""
        calls = send_calls(self._channel, messages, self.limits.send_batch_size)
        try:
            if len(calls) <= 1 or self.is_cluster:
                # A cluster sends chunk by chunk, each straight to the queue's node.
                replies = [self._run("send", args) for args in calls]
            else:
                self.check_server()
                replies = self._lua.pipelined("send", [(self._layout, args) for args in calls])
                for reply in replies:
                    log_warnings(self.keys.queue, reply[-1])
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [int(due) for reply in replies for due in reply[:-1]]

    def relay(
        self, messages: Sequence[NewMessage], *, forget: Sequence[str], keep_ms: int
    ) -> list[int | None]:
        """Write messages relayed from a database outbox, each once however often it comes
        (relay.lua; a keyed one decided by its key as send_keyed decides it); returns each
        one's due time, or None for one not written (relayed before, or kept or held by its
        key). ``forget``: ids whose outbox rows are deleted for good. Every message needs its
        ``at_ms``."""
        calls = relay_calls(self._channel, messages, forget, keep_ms, self.limits.send_batch_size)
        record = [self.keys.key("relayed")]
        try:
            if len(calls) <= 1 or self.is_cluster:
                replies = [self._run("relay", args, extra_keys=record) for args in calls]
            else:
                self.check_server()
                keys = [*self._layout, *record]
                replies = self._lua.pipelined("relay", [(keys, args) for args in calls])
                for reply in replies:
                    log_warnings(self.keys.queue, reply[-1])
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [None if int(due) < 0 else int(due) for reply in replies for due in reply[:-1]]

    def send_keyed(self, messages: Sequence[NewMessage]) -> list[KeyedSent]:
        """Schedule keyed messages (send_keyed.lua), one call per SEND_BATCH_SIZE chunk in
        turn, each straight to the queue's node: a chunk refused (DuplicateKey) writes
        nothing, and stops the chunks after it."""
        sent: list[KeyedSent] = []
        for chunk, args in send_keyed_calls(self._channel, messages, self.limits.send_batch_size):
            try:
                reply = self._run("send_keyed", args)
            except ResponseError as error:
                raise duplicate_key(error, chunk) or send_error(error, self.keys.queue) from None
            sent += keyed_sent(reply[:-1])
        return sent

    def lookup(self, key: str) -> StoredMessage | None:
        """The key's message (its waiting one, else the latest sent with it while still
        stored), or None when the key names nothing stored."""
        message_id, *reply = self._run("lookup", [wire(key)])
        return described(message_id, reply) if message_id else None

    def cancel_key(self, key: str) -> str | None:
        """Remove the key's message if it waits; returns its id, or None."""
        return cancelled_id(self._run("remove", cancel_key_args(key)))

    def reschedule(
        self,
        *,
        message_id: str | None = None,
        key: str | None = None,
        at_ms: int | None = None,
        delay_us: int = 0,
    ) -> int | None:
        """Give a waiting message (by id, or the key's) a new due time; returns it, or None
        when nothing waits under that id or key (reschedule.lua)."""
        args = reschedule_args(self._channel, message_id, key, at_ms, delay_us)
        return rescheduled_due(self._run("reschedule", args))

    def remove(
        self,
        message_id: str,
        *,
        include_in_flight_and_dead: bool = False,
        only_from: str | None = None,
    ) -> str | None:
        """Remove a message; returns the state it left, or None if nothing was removed.

        By default only a waiting message (pending, ready, retry) is removed: that is a
        cancel, after which the message is never delivered. With ``only_from``, only a
        message in that state is removed.
        """
        mode = "delete" if include_in_flight_and_dead else "cancel"
        return removed_state(self._run("remove", [wire(message_id), mode, only_from or ""]))

    # Consumers

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
        """Hand out up to ``count`` due messages, leased until now + consume_ms.

        A ``fetcher`` that names each ``request`` can repeat one whose reply it did not get:
        the repeat hands out again what that fetch took (see fetch.lua). ``gates``: how
        the flow gates apply, ``leased_from``: from when the leases run, if not now, and
        ``gated``: whether a reservation bound ``count`` (see engine.flow)."""
        limits = self.limits
        sent_at = time.monotonic()
        reply = self._run(
            "fetch",
            [
                *(self._channel, count, limits.consume_ms, limits.stage_limit, request),
                *(rate_wire(limits.rate_limit), limits.max_in_flight, gates),
                *(() if leased_from is None and not gated else _reserved(leased_from, gated)),
            ],
            extra_keys=[self.keys.key(f"fetch:{fetcher}")],
        )
        # Redis read its clock between sending and receiving: the middle is the best guess.
        received_at = time.monotonic()
        now, next_ms, expired, flat, owed, now_us, tracked, groups, unreserved, capped, _ = reply
        read_at = (sent_at + received_at) / 2
        deadline = (now if leased_from is None else leased_from) + limits.consume_ms
        deliveries = []
        is_tracked = bool(tracked)
        for i in range(0, len(flat), 6):
            key, generation, group = None, 0, None
            try:
                message_id, payload, unreadable = _text(flat[i]), _text(flat[i + 1]), ""
                if payload[:1] == KEY_MARK:  # (a plain payload pays this test only)
                    key, generation, payload = split_keyed(payload)
                if groups and groups[i // 6]:  # (empty unless the queue has had groups)
                    group = _text(groups[i // 6])
            except UnicodeDecodeError as error:
                message_id, payload = _id(flat[i]), _shown(flat[i + 1])
                unreadable = f"its id or payload is not UTF-8 text ({error})"
            # Positional, in Delivery's field order: keywords cost the hot path more.
            deliveries.append(
                Delivery(
                    message_id,
                    payload,
                    int(flat[i + 2]),
                    int(flat[i + 3]),
                    int(flat[i + 4]),
                    deadline,
                    int(flat[i + 5]),
                    unreadable,
                    key,
                    generation,
                    group,
                    is_tracked,
                )
            )
        return FetchResult(
            now_ms=int(now),
            next_ms=None if next_ms < 0 else int(next_ms),
            expired=int(expired),
            deliveries=deliveries,
            exhaustions_owed=bool(owed),
            now_us=int(now_us),
            read_at=read_at,
            read_within=(received_at - sent_at) / 2,
            unreserved=bool(unreserved),
            capped=bool(capped),
        )

    def flow(self, action: str = "read", rate: tuple[int, int] | None = None) -> FlowState:
        """Read the flow state, or change it first: "pause", "resume", or "rate" (set
        ``rate``, or None to go back to the setting's); see flow.lua."""
        paused, rate_text, _ = self._run("flow", [self._channel, action, rate_wire(rate)])
        return _flow_state(paused, rate_text)

    def copy_flow(self, state: FlowState) -> None:
        """Take shard 0's flow state (a shard of a sharded queue but shard 0; see
        engine.sharding.flow)."""
        self._run("flow", [self._channel, "copy", rate_wire(state.rate), int(state.paused)])

    def reserve(self, count: int, name: str) -> Reservation:
        """Reserve up to ``count`` hand-outs from a sharded queue's budget, on shard 0,
        as entries named after ``name`` (see flow_reserve.lua)."""
        limits = self.limits
        sent_at = time.monotonic()
        now, granted, again, rate_text, capped, _ = self._run(
            "flow_reserve",
            [count, name, rate_wire(limits.rate_limit), limits.max_in_flight, limits.consume_ms],
        )
        received_at = time.monotonic()
        return Reservation(
            int(now),
            int(granted),
            None if int(again) < 0 else int(again),
            parse_rate_wire(_text(rate_text)),
            read_at=(sent_at + received_at) / 2,
            read_within=(received_at - sent_at) / 2,
            capped=bool(capped),
        )

    def settle(
        self, name: str, reserved: int, used: int, ids: Sequence[str], beyond: int = 0
    ) -> None:
        """Give back what a reservation did not use, log what went out beyond it, and
        hold the slots of ``ids``, the deliveries handed out under a cap (see
        flow_settle.lua)."""
        limits = self.limits
        self._run(
            "flow_settle",
            [
                *(name, reserved, used, limits.consume_ms, rate_wire(limits.rate_limit)),
                *(beyond, len(ids), *map(wire, ids)),
            ],
        )

    def free_slots(self, ids: Sequence[str]) -> int:
        """Free the cap's slots of these deliveries (see flow_slots.lua)."""
        return self._slots("free", ids)

    def extend_slots(self, ids: Sequence[str]) -> int:
        """Hold the cap's slots of these deliveries until now + consume_ms."""
        return self._slots("extend", ids)

    def _slots(self, action: str, ids: Sequence[str]) -> int:
        changed, _ = self._run(
            "flow_slots", [action, self.limits.consume_ms, len(ids), *map(wire, ids)]
        )
        return int(changed)

    def _commit_record(self, fetcher: str, request: str) -> list[str]:
        """The extra key of a named ack or nack request: its caller's record (see ack.lua)."""
        return [self.keys.key(f"commit:{fetcher}")] if request else []

    def ack(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        fetcher: str = "",
        request: str = "",
        plain: bool = False,
        untracked: bool = False,
    ) -> set[str]:
        """Forget delivered messages; returns the ids whose lease still held.

        A ``fetcher`` that names each ``request`` can repeat one whose reply it did not get:
        the repeat answers what that request did (see ack.lua). ``plain``: none of them was
        sent with a key (their deliveries say so), so the key index is not looked at;
        ``untracked``: none was handed out while the queue had expiries or postpone counts
        (Delivery.tracked), so those are not looked at."""
        if not leases:
            return set()
        acked, _ = self._run(
            "ack",
            [
                request,
                self.limits.consume_ms,
                len(leases),
                *_id_rows(leases),
                *(["plain"] if plain else []),
                *(["untracked"] if untracked else []),
            ],
            extra_keys=self._commit_record(fetcher, request),
        )
        return {_id(message_id) for message_id in acked}

    def nack(
        self,
        refusals: Sequence[tuple[str, int, int]],
        *,
        fetcher: str = "",
        request: str = "",
        postponed: Collection[str] = (),
        max_postpones: int = 0,
    ) -> list[NackOutcome]:
        """Refuse deliveries: ``(id, lease, delay_ms)``; delay ``BURY`` buries at once.
        The ids in ``postponed`` are postponed: no attempt counted, and buried once
        postponed more than ``max_postpones`` times (see nack.lua).

        Returns the outcome of each refusal whose lease still held. A repeated ``request``
        answers what that request did, as for ack.
        """
        if not refusals:
            return []
        refused = {refusal[0] for refusal in refusals}
        flat, _ = self._run(
            "nack",
            [
                *(self._channel, request, self.limits.consume_ms, len(refusals)),
                *_id_rows(refusals),
                *postpone_args(refused, postponed, max_postpones),
            ],
            extra_keys=self._commit_record(fetcher, request),
        )
        return nack_outcomes(flat)

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        """Hand back deliveries that were never started, without using a retry."""
        if not leases:
            return []
        released, _ = self._run("release", [self._channel, len(leases), *_id_rows(leases)])
        return [_id(message_id) for message_id in released]

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        """Push deadlines to now + consume_ms; returns the new deadline and the ids extended."""
        if not leases:
            return 0, []
        deadline, extended, _ = self._run(
            "extend", [self.limits.consume_ms, len(leases), *_id_rows(leases)]
        )
        return int(deadline), [_id(message_id) for message_id in extended]

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """Claim exhausted messages whose announcement is owed (see confirm_exhausted)."""
        flat, _ = self._run("claim_exhausted", [count, claim_ms])
        claims = []
        for i in range(0, len(flat), 6):
            key, payload = None, _payload_text(flat[i + 1])
            if payload is not None:
                key, _, payload = split_keyed(payload)
            claims.append(
                ExhaustedClaim(
                    _id(flat[i]),
                    payload,
                    int(flat[i + 2]),
                    int(flat[i + 3]),
                    key,
                    reason=_shown(flat[i + 4]),
                    group=_optional_shown(flat[i + 5]),
                )
            )
        return claims

    def confirm_exhausted(self, claims: Sequence[tuple[str, int]]) -> int:
        """Record that claimed exhaustions were announced, each only while its claim holds."""
        if not claims:
            return 0
        confirmed, _ = self._run("confirm_exhausted", [len(claims), *_id_rows(claims)])
        return int(confirmed)

    def subscribe_wakeups(self) -> RedisWakeups:
        """Listen on the wake-up channel the scripts publish to."""
        return RedisWakeups(self.client, [self._channel])

    def subscribe_channels(self, channels: Sequence[str]) -> RedisWakeups:
        """Listen on several queues' wake-up channels (a sharded queue's), on this store's
        server: one subscription, one connection."""
        return RedisWakeups(self.client, channels)

    def layouts(self) -> set[int]:
        return {int(layout) for layout in self.client.smembers(self.keys.key("layouts"))}

    def add_layout(self, layout: int) -> tuple[bool, FlowState]:
        # One function, not SADD then PUBLISH: a process dying between those two calls
        # registered the layout without telling the workers.
        added, paused, rate_text, _ = self._run(
            "add_layout",
            [self._channel, layout, LAYOUTS_CHANGED],
            extra_keys=[self.keys.key("layouts")],
        )
        return bool(added), _flow_state(paused, rate_text)

    def retire_layout(self, layout: int) -> bool:
        return bool(self.client.srem(self.keys.key("layouts"), layout))

    def holds_key(self, key: str) -> bool:
        held, _ = self._run("holds_key", [wire(key)])
        return bool(held)

    def keys_used(self) -> bool:
        return bool(self.client.exists(self.keys.key("keys")))

    def stored_keys(self) -> Iterator[str]:
        client: Any = self.client  # redis-py types hscan_iter loosely
        for key, _ in client.hscan_iter(self.keys.key("keys"), count=1000):
            if key:  # (not the field "" that marks a queue that has had keys)
                yield key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        """Move dead letters back to pending, due now, with a fresh retry budget."""
        if not message_ids:
            return []
        requeued, _ = self._run("requeue", [self._channel, default_budget, *map(wire, message_ids)])
        return [_id(message_id) for message_id in requeued]

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        """Make pending messages due now."""
        if not message_ids:
            return []
        promoted, _ = self._run("promote", [self._channel, *map(wire, message_ids)])
        return [_id(message_id) for message_id in promoted]

    def drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        limit: int,
        keep_unannounced: bool,
        offset: int = 0,
        buried_before_ms: int | None = None,
    ) -> tuple[int, int]:
        """Delete dead letters (all, buried at least older_than_ms ago, or buried before
        buried_before_ms), examining at most limit after the oldest ``offset``; returns how
        many were deleted and how many kept."""
        age = -1 if older_than_ms is None else older_than_ms
        before = -1 if buried_before_ms is None else buried_before_ms
        dropped, kept, _ = self._run(
            "drop_garbage", [age, limit, int(keep_unannounced), offset, before]
        )
        return int(dropped), int(kept)

    def stats(self) -> dict[str, int]:
        return parse_stats(self._run("stats", []))

    def snapshot(self) -> list[Any]:
        """Every id the queue holds, read atomically (snapshot.lua; see engine.invariants)."""
        reply: list[Any] = self._run("snapshot", [])
        return reply

    def unreadable_payloads(self) -> list[Any]:
        """Read a page at a time (HSCAN), never holding Redis up; see engine.invariants."""
        client: Any = self.client  # redis-py types hscan_iter loosely
        unreadable = []
        for message_id, payload in client.hscan_iter(self.keys.key("payload"), count=1000):
            if _payload_text(payload) is None:
                unreadable.append(message_id)
        return unreadable

    def throughput(self, minutes: int) -> list[tuple[int, int, int]]:
        """``(minute_start_ms, acked, failed)`` for the last ``minutes`` minutes, oldest first."""
        _, flat, _ = self._run("throughput", [minutes])
        return [
            (int(flat[i]) * 60_000, int(flat[i + 1]), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    def add_totals(self, increments: Mapping[str, int]) -> None:
        """Add worker-measured counts to the queue's running totals (names without "all:")."""
        pairs = [(name, count) for name, count in increments.items() if count]
        if pairs:
            self._run("add_totals", [len(pairs), *(value for pair in pairs for value in pair)])

    def totals(self) -> dict[str, int]:
        """Every running total, by name: the scripts' own and those added by workers."""
        flat, _ = self._run("totals", [])
        return {_shown(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def prune_throughput(self, keep_minutes: int) -> int:
        """Forget per-minute counts older than ``keep_minutes``; returns how many."""
        pruned, _ = self._run("prune_throughput", [keep_minutes])
        return int(pruned)

    def list(
        self, state: str, *, offset: int, limit: int, preview_bytes: int
    ) -> list[StoredMessage]:
        """One page of the messages in ``state``, in queue order."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; the states are {', '.join(STATES)}")
        flat, _ = self._run("list", [state, offset, limit, preview_bytes])
        return [
            replace(
                _stored(flat[i], state, flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4], False),
                group=_optional_shown(flat[i + 5]),
            )
            for i in range(0, len(flat), 6)
        ]

    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it; its
        payload cut to at most ``preview_bytes`` bytes, as ``list`` cuts, if that is given."""
        args = [wire(message_id)] if preview_bytes is None else [wire(message_id), preview_bytes]
        return described(message_id, self._run("peek", args))

    def peek_payload(self, message_id: str) -> bytes | None:
        """The payload as peek reads it whole, but not decoded: bytes that are not UTF-8
        (only a foreign write stores them) stay those bytes, where peek shows them as
        escapes."""
        payload = self._run("peek", [wire(message_id)])[2]
        if payload is None:
            return None
        body = split_keyed(_id(payload))[2]
        return split_trace(wire(body))[1]

    def held(self, message_ids: Sequence[str]) -> set[str]:
        # Every message held, whatever its state, has its payload: ack, remove and the
        # dropping of dead letters delete it with the message.
        if not message_ids:
            return set()
        pipe: Any = self.client.pipeline(transaction=False)
        payloads = self.keys.key("payload")
        for message_id in message_ids:
            pipe.hexists(payloads, wire(message_id))
        found = pipe.execute()
        return {message_id for message_id, there in zip(message_ids, found, strict=True) if there}

    # Schedules (schedule.lua, schedules.lua)

    def read_schedules(self) -> ScheduleListing:
        return self._read_schedules([])

    def read_schedule(self, name: str) -> ScheduleRecord | None:
        _, records = self._read_schedules([wire(name)])
        return records[0] if records else None

    def _read_schedules(self, args: Sequence[Any]) -> ScheduleListing:
        now, flat, _ = self._run("schedules", args, extra_keys=self.keys.schedule_keys)
        records = [
            parse_schedule_record(
                _id(flat[i]),
                _optional_shown(flat[i + 1]),
                _optional_shown(flat[i + 2]),
                _optional_shown(flat[i + 3]),
            )
            for i in range(0, len(flat), 4)
        ]
        return int(now), records

    def _schedule(
        self,
        op: str,
        name: str,
        *,
        fingerprint: str = "",
        definition: str = "",
        expect: str = "any",
        start_ms: int = 0,
        tick: Tick | None = None,
    ) -> ScheduleReply:
        args = [op, self._channel, wire(name), fingerprint, definition, expect, start_ms]
        args += [0, 0, ""] if tick is None else [tick.at_ms, tick.budget, tick.payload]
        status, cursor, tick_ms, previous, now, _ = self._run(
            "schedule", args, extra_keys=self.keys.schedule_keys
        )
        return ScheduleReply(_text(status), int(cursor), int(tick_ms), int(previous), int(now))

    def write_tick(self, name: str, fingerprint: str, tick: Tick) -> ScheduleReply:
        return self._schedule("tick", name, fingerprint=fingerprint, tick=tick)

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
        return self._schedule(
            "put",
            name,
            fingerprint=fingerprint,
            definition=definition,
            expect=expect,
            start_ms=start_ms,
            tick=first,
        )

    def pause_schedule(self, name: str, start_ms: int) -> ScheduleReply:
        return self._schedule("pause", name, start_ms=start_ms)

    def resume_schedule(
        self, name: str, fingerprint: str, start_ms: int, first: Tick | None
    ) -> ScheduleReply:
        return self._schedule(
            "resume", name, fingerprint=fingerprint, start_ms=start_ms, tick=first
        )

    def remove_schedule(self, name: str, fingerprint: str = "") -> ScheduleReply:
        return self._schedule("remove", name, fingerprint=fingerprint)

    def declare_schedule(self, name: str) -> ScheduleReply:
        return self._schedule("declare", name)

    def retire_schedule(self, name: str, fingerprint: str, undeclared_ms: int) -> ScheduleReply:
        return self._schedule("retire", name, fingerprint=fingerprint, start_ms=undeclared_ms)

    def report_schedule_failure(
        self, name: str, fingerprint: str, failure: ScheduleFailure
    ) -> ScheduleReply:
        return self._schedule(
            "fail",
            name,
            fingerprint=fingerprint,
            definition=failure.reason[:LONGEST_FAILURE_REASON],
            start_ms=failure.since_ms,
        )

    # Task results (delayqueue_django.tasks): a hash per result, beside the queue's keys,
    # living ttl_seconds after its last change (or until deleted, with None).

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        key = self.keys.key(f"task:{result_id}")
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping=dict(fields))
        for name, value in unless_set.items():
            pipe.hsetnx(key, name, value)
        if ttl_seconds is None:
            pipe.persist(key)
        else:
            pipe.expire(key, ttl_seconds)
        pipe.hgetall(key)
        return _text_dict(pipe.execute()[-1])

    def read_result(self, result_id: str) -> dict[str, str]:
        client: Any = self.client
        return _text_dict(client.hgetall(self.keys.key(f"task:{result_id}")))

    # Worker heartbeats: a key per worker, expiring on its own, and an index set of their
    # ids that readers prune of the expired ones.

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.key(f"worker:{worker_id}"), details, px=max(ttl_ms, 1))
        pipe.sadd(self.keys.key("workers"), worker_id)
        pipe.execute()

    def drop_heartbeat(self, worker_id: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.key(f"worker:{worker_id}"))
        pipe.srem(self.keys.key("workers"), worker_id)
        pipe.execute()

    def heartbeats(self) -> dict[str, str]:
        client: Any = self.client  # redis-py types smembers/mget loosely
        index = self.keys.key("workers")
        ids = sorted(_id(member) for member in client.smembers(index))
        if not ids:
            return {}
        keys = [wire(self.keys.key(f"worker:{worker_id}")) for worker_id in ids]
        live = {
            worker_id: _shown(value)
            for worker_id, value in zip(ids, client.mget(keys), strict=True)
            if value is not None
        }
        gone = [wire(worker_id) for worker_id in ids if worker_id not in live]
        if gone:
            client.srem(index, *gone)
        return live


def _text_dict(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(name): _text(value) for name, value in raw.items()}


def _id_rows(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``(id, ...)`` rows as one flat list of script arguments, ids as wire sends them.
    Checked first, as these are the verdicts' hot path: an ASCII id (str.isascii() reads
    a flag) goes as it is, and only a batch with another id pays for the encoding."""
    if all(row[0].isascii() for row in rows):
        return [value for row in rows for value in row]
    return [value for row in rows for value in (wire(row[0]), *row[1:])]


def described(message_id: bytes | str, reply: Sequence[Any]) -> StoredMessage | None:
    """peek.lua's reply (lookup.lua's after the id) as a StoredMessage, or None when the
    queue does not know the message. (AsyncRedisStore reads lookup's with it too.)"""
    state, score, payload, size, meta, unannounced, group, reason = reply[:8]
    state = _text(state)
    if not state and payload is None and meta is None:
        return None
    stored = _stored(message_id, state or "unknown", score, payload, size, meta, bool(unannounced))
    stored = replace(stored, group=_optional_shown(group))
    return replace(stored, dead_reason=_shown(reason)) if reason else stored


def _stored(
    message_id: bytes | str,
    state: str,
    score: int,
    payload: bytes | str | None,
    size: int,
    meta: bytes | str | None,
    unannounced: bool,
) -> StoredMessage:
    parsed = parse_meta(_optional_shown(meta))
    lease, attempt, budget = parsed if parsed else (None, None, None)
    shown = _optional_shown(payload)
    key, generation = None, 0
    if shown is not None:
        key, generation, shown = split_keyed(shown)
    return StoredMessage(
        id=_id(message_id),
        state=state,
        score_ms=None if int(score) < 0 else int(score),
        # Without the trace context a traced send put before it (see tracing.py).
        payload=None if shown is None else split_trace(shown)[1],
        payload_size=int(size),
        lease=lease,
        attempt=attempt,
        budget=budget,
        unannounced=unannounced,
        key=key,
        generation=generation,
    )


def _reserved(leased_from: int | None, gated: bool) -> tuple[int | str, ...]:
    """fetch.lua's ARGV[9] and ARGV[10], for a shard's fetch within a reservation."""
    return ("" if leased_from is None else leased_from, *((1,) if gated else ()))
