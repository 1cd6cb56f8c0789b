"""A ``RedisStore``'s operator calls: requeue, promote, drop dead letters, the stats and
running totals, listing and peeking, and the snapshots the invariant checker reads."""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from redis.exceptions import ResponseError

from delayqueue_django.engine.history import foreign, last_of, parse_history
from delayqueue_django.engine.keyed import split_keyed
from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.metrics import MetricsRead, read_reply
from delayqueue_django.engine.outcomes import ended_message, outcome_arg
from delayqueue_django.engine.records import STATES, Attempt, Attempts, StoredMessage, split_trace
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.replies import (
    _id,
    _optional_shown,
    _payload_text,
    _shown,
    _stored,
    described,
    parse_stats,
)


class RedisOperating(RedisStoreBase):
    """What the admin, the commands and the monitoring ask of a queue."""

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
            "drop_garbage",
            [age, limit, int(keep_unannounced), offset, before, *outcome_arg(self.limits)],
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

    def metrics(self, back_minutes: int) -> MetricsRead:
        """The metrics history from ``back_minutes`` before the current minute on."""
        return read_reply(self._run("metrics", [back_minutes]))

    def add_totals(self, increments: Mapping[str, int]) -> None:
        """Add worker-measured counts to the queue's running totals (names without "all:")."""
        pairs = [(name, count) for name, count in increments.items() if count]
        if pairs:
            self._run("add_totals", [len(pairs), *(value for pair in pairs for value in pair)])

    def totals(self) -> dict[str, int]:
        """Every running total, by name: the scripts' own and those added by workers."""
        flat, _ = self._run("totals", [])
        return {_shown(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def prune_throughput(self) -> int:
        """The metrics history's upkeep (see prune_throughput.lua); returns how many hours
        were rolled up and old fields moved."""
        pruned, _ = self._run("prune_throughput", [])
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

    def ended(
        self, message_id: str | None = None, *, key: str | None = None
    ) -> StoredMessage | None:
        """The outcome record of a message that ended (see engine.outcomes), by its id or
        its key; None when there is none (never ended, or its retention passed)."""
        by, name = ("id", message_id) if key is None else ("key", key)
        if name is None:
            raise ValueError("ended: give a message_id or a key")
        found, raw, _ = self._run("ended", [by, wire(name)])
        return ended_message(_id(found), raw) if found and raw is not None else None

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

    def history(self, message_id: str) -> Attempts:
        """The message's attempt records, oldest first (see engine.history)."""
        client: Any = self.client
        try:
            return parse_history(client.hget(self.keys.key("history"), wire(message_id)))
        except ResponseError as error:
            if not str(error).startswith("WRONGTYPE"):
                raise
            return [foreign(self._type_of("history"))]

    def last_errors(self, message_ids: Sequence[str]) -> dict[str, Attempt]:
        """The newest record of each message that has one: one HMGET."""
        if not message_ids:
            return {}
        client: Any = self.client
        try:
            raws = client.hmget(self.keys.key("history"), [wire(i) for i in message_ids])
        except ResponseError as error:
            if not str(error).startswith("WRONGTYPE"):
                raise
            damage = foreign(self._type_of("history"))
            return dict.fromkeys(message_ids, damage)
        found = {i: last_of(raw) for i, raw in zip(message_ids, raws, strict=True)}
        return {i: attempt for i, attempt in found.items() if attempt is not None}

    def _type_of(self, part: str) -> str:
        client: Any = self.client
        return _shown(client.type(self.keys.key(part)))
