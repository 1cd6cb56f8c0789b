"""The store: one queue's state in Redis, changed only through the Lua scripts.

Every public method is one round trip (a bulk send on Redis Cluster is one per chunk) and
one atomic step per script call; no client-side locks, so any number of producers and
consumers may share a queue.
"""

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import OutOfMemoryError, ResponseError

from delayqueue_django.engine.errors import (
    DuplicateMessageId,
    RedisOutOfMemory,
    UnsupportedRedisVersion,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.pubsub import RedisWakeups
from delayqueue_django.engine.records import (
    STATES,
    Delivery,
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
    StoredMessage,
    StoreLimits,
)
from delayqueue_django.engine.scripts import Scripts

logger = logging.getLogger("delayqueue_django.engine")

RedisClient: TypeAlias = Redis | RedisCluster

# LPOP with a count, ZRANGE ... BYSCORE LIMIT and ZMSCORE arrived in Redis 6.2.
MINIMUM_REDIS_VERSION = (6, 2)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _optional_text(value: bytes | str | None) -> str | None:
    return None if value is None else _text(value)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def parse_meta(raw: str | None) -> tuple[int, int, int] | None:
    """Lease, attempt and budget from ``"lease:attempt:budget:due"``, or None when the
    record is missing or damaged. (A record from before ``due`` was kept has 3 fields.)"""
    if raw is None:
        return None
    parts = raw.split(":")
    if len(parts) not in (3, 4) or not all(part.isdigit() for part in parts):
        return None
    lease, attempt, budget = (int(part) for part in parts[:3])
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
    for subject, reason in warnings:
        logger.warning(
            "damaged queue state queue=%s subject=%s: %s", queue, _text(subject), _text(reason)
        )


def send_calls(channel: str, messages: Sequence[NewMessage], batch_size: int) -> list[list[Any]]:
    """The send script's ARGV for each chunk of ``batch_size`` messages."""
    calls = []
    for chunk in _chunks(messages, batch_size):
        args: list[Any] = [channel, len(chunk)]
        for message in chunk:
            at = "" if message.at_ms is None else message.at_ms
            args += [message.id, at, message.delay_ms, message.budget, message.payload]
        calls.append(args)
    return calls


def send_error(error: ResponseError, queue: str) -> Exception:
    """The send script's refusals as the package's exceptions; any other error as it is."""
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


def removed_state(reply: Sequence[Any]) -> str | None:
    return _text(reply[0]) or None


STATS_NAMES = (
    *("pending", "ready", "unack", "retry", "garbage", "due", "unannounced"),
    *("server_time_ms", "next_due_ms", "lag_ms"),
    # Running totals since the queue began (they add up across workers).
    *("acked_total", "failed_total", "retried_total", "timed_out_total", "exhausted_total"),
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
        self._scripts = Scripts(client)
        self._version_checked = False
        self._version_lock = threading.Lock()

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    def check_server(self) -> None:
        """Refuse a Redis too old for the scripts (asked once per store)."""
        if self._version_checked:
            return
        with self._version_lock:
            if self._version_checked:
                return
            require_supported(oldest_version(self.client.info("server")), self.keys.queue)
            self._version_checked = True

    def _run(
        self, name: str, args: Sequence[Any], client: Any = None, extra_keys: Sequence[str] = ()
    ) -> Any:
        self.check_server()
        keys = [*self._layout, *extra_keys] if extra_keys else self._layout
        reply = self._scripts[name](keys=keys, args=args, client=client)
        if client is None:
            log_warnings(self.keys.queue, reply[-1])
        return reply

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages; returns each one's due time in ms (server clock)."""
        calls = send_calls(self._channel, messages, self.limits.send_batch_size)
        try:
            if len(calls) <= 1 or self.is_cluster:
                # Redis Cluster pipelines refuse EVALSHA, so a cluster sends chunk by chunk.
                replies = [self._run("send", args) for args in calls]
            else:
                self.check_server()
                pipe = self.client.pipeline(transaction=False)
                for args in calls:
                    self._run("send", args, client=pipe)
                replies = pipe.execute()
                for reply in replies:
                    log_warnings(self.keys.queue, reply[-1])
        except ResponseError as error:
            raise send_error(error, self.keys.queue) from None
        return [int(due) for reply in replies for due in reply[:-1]]

    def remove(self, message_id: str, *, include_in_flight_and_dead: bool = False) -> str | None:
        """Remove a message; returns the state it left, or None if nothing was removed.

        By default only a waiting message (pending, ready, retry) is removed: that is a
        cancel, after which the message is never delivered.
        """
        mode = "delete" if include_in_flight_and_dead else "cancel"
        return removed_state(self._run("remove", [message_id, mode]))

    # Consumers

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        """Hand out up to ``count`` due messages, leased until now + consume_ms.

        A ``fetcher`` that names each ``request`` can repeat one whose reply it did not get:
        the repeat hands out again what that fetch took (see fetch.lua)."""
        limits = self.limits
        sent_at = time.monotonic()
        now, next_ms, expired, flat, owed, now_us, _ = self._run(
            "fetch",
            [self._channel, count, limits.consume_ms, limits.stage_limit, request],
            extra_keys=[self.keys.key(f"fetch:{fetcher}")],
        )
        # Redis read its clock between sending and receiving: the middle is the best guess.
        read_at = (sent_at + time.monotonic()) / 2
        deadline = now + limits.consume_ms
        deliveries = [
            Delivery(
                id=_text(flat[i]),
                payload=_text(flat[i + 1]),
                attempt=int(flat[i + 2]),
                lease=int(flat[i + 3]),
                budget=int(flat[i + 4]),
                deadline_ms=deadline,
                due_ms=int(flat[i + 5]),
            )
            for i in range(0, len(flat), 6)
        ]
        return FetchResult(
            now_ms=int(now),
            next_ms=None if next_ms < 0 else int(next_ms),
            expired=int(expired),
            deliveries=deliveries,
            exhaustions_owed=bool(owed),
            now_us=int(now_us),
            read_at=read_at,
        )

    def ack(self, leases: Sequence[tuple[str, int]]) -> set[str]:
        """Forget delivered messages; returns the ids whose lease still held."""
        if not leases:
            return set()
        acked, _ = self._run("ack", [len(leases), *_flatten(leases)])
        return {_text(message_id) for message_id in acked}

    def nack(self, refusals: Sequence[tuple[str, int, int]]) -> list[NackOutcome]:
        """Refuse deliveries: ``(id, lease, delay_ms)``; delay ``BURY`` buries at once.

        Returns the outcome of each refusal whose lease still held.
        """
        if not refusals:
            return []
        flat, _ = self._run("nack", [self._channel, len(refusals), *_flatten(refusals)])
        return [
            NackOutcome(_text(flat[i]), int(flat[i + 1]) == 2, int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        """Hand back deliveries that were never started, without using a retry."""
        if not leases:
            return []
        released, _ = self._run("release", [self._channel, len(leases), *_flatten(leases)])
        return [_text(message_id) for message_id in released]

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        """Push deadlines to now + consume_ms; returns the new deadline and the ids extended."""
        if not leases:
            return 0, []
        deadline, extended, _ = self._run(
            "extend", [self.limits.consume_ms, len(leases), *_flatten(leases)]
        )
        return int(deadline), [_text(message_id) for message_id in extended]

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """Claim exhausted messages whose announcement is owed (see confirm_exhausted)."""
        flat, _ = self._run("claim_exhausted", [count, claim_ms])
        return [
            ExhaustedClaim(_text(flat[i]), _optional_text(flat[i + 1]), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    def confirm_exhausted(self, message_ids: Sequence[str]) -> int:
        """Record that these exhaustions were announced."""
        if not message_ids:
            return 0
        return int(self.client.zrem(self.keys.key("exhausted"), *message_ids))

    def subscribe_wakeups(self) -> RedisWakeups:
        """Listen on the wake-up channel the scripts publish to."""
        return RedisWakeups(self.client, self._channel)

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        """Move dead letters back to pending, due now, with a fresh retry budget."""
        if not message_ids:
            return []
        requeued, _ = self._run("requeue", [self._channel, default_budget, *message_ids])
        return [_text(message_id) for message_id in requeued]

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        """Make pending messages due now."""
        if not message_ids:
            return []
        promoted, _ = self._run("promote", [self._channel, *message_ids])
        return [_text(message_id) for message_id in promoted]

    def drop_garbage(
        self, *, older_than_ms: int | None, limit: int, keep_unannounced: bool
    ) -> tuple[int, bool]:
        """Delete dead letters (all, or buried at least older_than_ms ago), at most limit."""
        age = -1 if older_than_ms is None else older_than_ms
        dropped, more, _ = self._run("drop_garbage", [age, limit, int(keep_unannounced)])
        return int(dropped), bool(more)

    def stats(self) -> dict[str, int]:
        return parse_stats(self._run("stats", []))

    def snapshot(self) -> list[Any]:
        """Every id the queue holds, read atomically (snapshot.lua; see engine.invariants)."""
        reply: list[Any] = self._run("snapshot", [])
        return reply

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
            self._run("add_totals", [len(pairs), *_flatten(pairs)])

    def totals(self) -> dict[str, int]:
        """Every running total, by name: the scripts' own and those added by workers."""
        flat, _ = self._run("totals", [])
        return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

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
            _stored(flat[i], state, flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4], False)
            for i in range(0, len(flat), 5)
        ]

    def peek(self, message_id: str) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it."""
        state, score, payload, meta, unannounced, _ = self._run("peek", [message_id])
        state = _text(state)
        if not state and payload is None and meta is None:
            return None
        size = 0 if payload is None else len(payload)
        return _stored(
            message_id, state or "unknown", score, payload, size, meta, bool(unannounced)
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
        ids = sorted(_text(member) for member in client.smembers(index))
        if not ids:
            return {}
        values = client.mget([self.keys.key(f"worker:{worker_id}") for worker_id in ids])
        live = {
            worker_id: _text(value)
            for worker_id, value in zip(ids, values, strict=True)
            if value is not None
        }
        gone = [worker_id for worker_id in ids if worker_id not in live]
        if gone:
            client.srem(index, *gone)
        return live


def _text_dict(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(name): _text(value) for name, value in raw.items()}


def _flatten(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    return [value for row in rows for value in row]


def _stored(
    message_id: bytes | str,
    state: str,
    score: int,
    payload: bytes | str | None,
    size: int,
    meta: bytes | str | None,
    unannounced: bool,
) -> StoredMessage:
    parsed = parse_meta(_optional_text(meta))
    lease, attempt, budget = parsed if parsed else (None, None, None)
    return StoredMessage(
        id=_text(message_id),
        state=state,
        score_ms=None if int(score) < 0 else int(score),
        payload=_optional_text(payload),
        payload_size=int(size),
        lease=lease,
        attempt=attempt,
        budget=budget,
        unannounced=unannounced,
    )
