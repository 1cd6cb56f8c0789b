"""What a queue needs from the place its messages live: the ``Store`` protocol.

``RedisStore`` (the Lua scripts) and ``MemoryStore`` (the same life cycle in this process)
both implement it; ``Queue``, the worker and the admin depend only on it, so the two can never
drift apart in signature. Their behaviour is held together by the engine's contract tests,
which run against both.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.records import (
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
    StoredMessage,
    StoreLimits,
)


class WakeupSubscription(Protocol):
    """A listener on a queue's wake-ups: work came due earlier than sleeping workers planned."""

    def wait(self, timeout: float) -> int | None:
        """Block until the next wake-up and return the due time it announced (ms), or None
        when ``timeout`` seconds pass without one."""

    def close(self) -> None: ...


class Store(Protocol):
    """One queue's state. Every method is one atomic step."""

    @property
    def keys(self) -> QueueKeys: ...

    @property
    def limits(self) -> StoreLimits: ...

    # Producers

    def send(self, messages: Sequence[NewMessage]) -> list[int]:
        """Schedule messages; returns each one's due time in ms (the store's clock).
        Raises DuplicateMessageId, writing nothing of that batch, if an id is known."""

    def remove(self, message_id: str, *, include_in_flight_and_dead: bool = False) -> str | None:
        """Remove a message; returns the state it left, or None if nothing was removed."""

    # Consumers

    def fetch(self, count: int, *, fetcher: str = "", request: str = "") -> FetchResult:
        """Hand out up to ``count`` due messages, leased until now + consume_ms.

        A fetch that repeats ``request``, the id of the ``fetcher``'s last fetch, hands out
        again what that fetch took (its reply was lost), with new leases and the same
        attempts, and takes nothing new.
        """

    def ack(self, leases: Sequence[tuple[str, int]]) -> set[str]:
        """Forget delivered messages; returns the ids whose lease still held."""

    def nack(self, refusals: Sequence[tuple[str, int, int]]) -> list[NackOutcome]:
        """Refuse deliveries: ``(id, lease, delay_ms)``; delay ``BURY`` buries at once."""

    def release(self, leases: Sequence[tuple[str, int]]) -> list[str]:
        """Hand back deliveries that were never started, without using a retry."""

    def extend(self, leases: Sequence[tuple[str, int]]) -> tuple[int, list[str]]:
        """Push deadlines to now + consume_ms; returns the new deadline and the ids extended."""

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """Claim exhausted messages whose announcement is owed (see confirm_exhausted)."""

    def confirm_exhausted(self, message_ids: Sequence[str]) -> int:
        """Record that these exhaustions were announced."""

    def subscribe_wakeups(self) -> WakeupSubscription:
        """Listen to the queue's wake-ups; the subscription is active when this returns."""

    # Operators

    def requeue(self, message_ids: Sequence[str], default_budget: int) -> list[str]:
        """Move dead letters back to pending, due now, with a fresh retry budget."""

    def promote(self, message_ids: Sequence[str]) -> list[str]:
        """Make pending messages due now."""

    def drop_garbage(
        self, *, older_than_ms: int | None, limit: int, keep_unannounced: bool
    ) -> tuple[int, bool]:
        """Delete dead letters (all, or buried at least older_than_ms ago), at most limit."""

    def stats(self) -> dict[str, int]: ...

    def snapshot(self) -> list[Any]:
        """Every id the queue holds, read atomically, for the invariant checker."""
        ...

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

    def peek(self, message_id: str) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it."""

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
