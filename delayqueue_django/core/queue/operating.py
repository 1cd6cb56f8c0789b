"""``Queue``'s inspection and admin operations: stats, throughput, listing and peeking,
and deleting, requeueing, delivering now and purging messages."""

from collections.abc import Sequence
from dataclasses import replace

from delayqueue_django.core import features
from delayqueue_django.core.queue.base import QueueBase, _check_id, _reaching_redis
from delayqueue_django.core.queue.key_options import check_key
from delayqueue_django.engine.invariants import InvariantReport, check_queue
from delayqueue_django.engine.records import STATES, Attempt, Attempts, StoredMessage

# How many dead letters one purge or retention call deletes per script call.
GARBAGE_DROP_BATCH = 1000
# Per-minute throughput counts older than this are pruned by the workers.
THROUGHPUT_MINUTES_KEPT = 60


class QueueOperating(QueueBase):
    """Reading the queue's state, and an operator's changes to it."""

    # Inspecting and operating

    @_reaching_redis
    def stats(self) -> dict[str, int]:
        """Counts per state and timing, in one round trip (one per shard of a sharded
        queue).

        Keys: pending, ready, unack, retry, garbage, due (pending and already due),
        unannounced (exhaustions not yet signalled), server_time_ms, next_due_ms (-1 when
        nothing is pending), lag_ms (age of the oldest due message not yet handed out,
        pending or staged in ready or retry), and the running totals since the queue began:
        acked_total, failed_total, retried_total, timed_out_total, exhausted_total,
        superseded_total (keyed messages removed on their way back to waiting, see
        docs/guides/keys.md). A queue whose ``OUTBOX`` option is on also has ``outbox``
        and ``outbox_age_ms`` (see ``outbox_stats``), read from its database: its senders
        write there, so whoever reads its stats can too.

        ``shards_down`` (always there, 0 normally) counts the shards of a sharded queue
        whose Redis could not be read: the other figures then leave them out (the counts
        and totals are short, the times those of the shards read). A shard on a server
        that already failed this call is not asked. Raises QueueUnavailable only when no
        shard at all could be read.
        """
        counts = self.store.stats()
        if self.config.outbox:
            counts.update(self.outbox_stats())
        return counts

    @_reaching_redis
    def outbox_stats(self) -> dict[str, int]:
        """This queue's rows waiting in the outbox (DELAYQUEUE_OUTBOX_DATABASES), read from
        the database: ``outbox`` (how many) and ``outbox_age_ms`` (how long the oldest has
        waited; 0 when none). ``stats()`` includes them for a queue whose OUTBOX option is on."""
        return features.outbox().waiting(self.name)

    def check_invariants(self) -> InvariantReport:
        """Check the queue's state in Redis: every message in exactly one state, nothing
        orphaned (see ``engine.invariants``). One atomic read of the whole queue: O(n)."""
        return check_queue(self.store)

    @_reaching_redis
    def throughput(self, minutes: int = 15) -> list[tuple[int, int, int]]:
        """Acked and failed deliveries per minute: ``(minute_start_ms, acked, failed)`` for
        the last ``minutes`` minutes (Redis clock), oldest first, in one round trip."""
        if not 1 <= minutes <= THROUGHPUT_MINUTES_KEPT:
            raise ValueError(f"minutes must be 1..{THROUGHPUT_MINUTES_KEPT}, not {minutes}")
        return self.store.throughput(minutes)

    @_reaching_redis
    def prune_throughput(self) -> int:
        return self.store.prune_throughput(THROUGHPUT_MINUTES_KEPT)

    @_reaching_redis
    def list_messages(
        self, state: str, *, offset: int = 0, limit: int = 50, preview_bytes: int = 1000
    ) -> list[StoredMessage]:
        """One page of messages in a state (pending, ready, unack, retry or garbage)."""
        if offset < 0 or not 0 <= limit <= 1000:
            raise ValueError(f"offset must be >= 0 and limit 0..1000 (got {offset}, {limit})")
        listed = self.store.list(state, offset=offset, limit=limit, preview_bytes=preview_bytes)
        return self._with_last_errors(listed) if state == "garbage" else listed

    @_reaching_redis
    def peek(self, message_id: str, *, preview_bytes: int | None = None) -> StoredMessage | None:
        """Where a message is and what it holds, or None if the queue does not know it.

        The payload comes whole by default. With ``preview_bytes``, a longer one is cut in
        Redis to at most that many bytes, on a UTF-8 character boundary, as
        [`list_messages`][delayqueue_django.core.queue.Queue.list_messages] cuts its previews: the
        rest never leaves Redis. ``payload_size`` is the whole payload's size either way, so
        ``payload_size > preview_bytes`` says it was cut.
        """
        if preview_bytes is not None and preview_bytes < 0:
            raise ValueError(f"preview_bytes must be >= 0 or None (got {preview_bytes})")
        stored = self.store.peek(_check_id(message_id), preview_bytes=preview_bytes)
        if stored is None or stored.state != "garbage":
            return stored
        return self._with_last_errors([stored])[0]

    @_reaching_redis
    def lookup(self, key: str) -> StoredMessage | None:
        """The message ``key`` names, with its id (``.id``), state, due time (``score``),
        attempt and payload; None when the key names nothing stored.

        That is the key's waiting message if one waits, else the latest message sent with
        the key while it is still stored (in flight, or dead). A key whose latest message
        was handled or cancelled names nothing, even while an older message with the key is
        still dead: lookup follows the latest message only (list the dead letters to find
        older ones).
        """
        key = check_key(key)
        return self.store.lookup(key)

    @_reaching_redis
    def peek_payload(self, message_id: str) -> bytes | None:
        """A message's whole payload as the very bytes stored, or None if it has none (the
        admin's download). ``peek`` gives it as text, where bytes that are not UTF-8 (only a
        write from outside the app stores them) are shown as ``\\xNN`` escapes; here they
        stay those bytes."""
        return self.store.peek_payload(_check_id(message_id))

    @_reaching_redis
    def delete(self, message_id: str, *, state: str | None = None) -> str | None:
        """Delete a message from whatever state it is in, or only if it is in ``state``
        (one of pending, ready, unack, retry, garbage: the state an operator saw it in);
        returns the state it left, or None."""
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
        return self.store.remove(
            _check_id(message_id), include_in_flight_and_dead=True, only_from=state
        )

    @_reaching_redis
    def requeue(self, message_ids: Sequence[str]) -> list[str]:
        """Dead letters back to pending, due now, with a fresh retry budget."""
        return self.store.requeue([_check_id(i) for i in message_ids], self.config.retry_count)

    @_reaching_redis
    def held(self, message_ids: Sequence[str]) -> set[str]:
        """Those of these messages the queue still holds, in any state (dead letters too)."""
        return self.store.held([_check_id(i) for i in message_ids])

    def _with_last_errors(self, dead: list[StoredMessage]) -> list[StoredMessage]:
        """Dead letters with their newest attempt record (``last_error``): one more round
        trip per shard."""
        found = self.store.last_errors([stored.id for stored in dead]) if dead else {}
        return [replace(stored, last_error=found.get(stored.id)) for stored in dead]

    @_reaching_redis
    def history(self, message_id: str) -> Attempts:
        """The message's attempt records, oldest first: one per refused delivery (an
        exception, a False, Retry, Reject, Postpone, the time limit, a lease that ran out),
        at most HISTORY_ATTEMPTS of them, the newest kept; [] for a message that never
        failed, or is gone (its records go with it). See docs/guides/failures-and-history.md.
        """
        return self.store.history(_check_id(message_id))

    @_reaching_redis
    def last_errors(self, message_ids: Sequence[str]) -> dict[str, Attempt]:
        """The newest attempt record of each of these messages that has one, by id (one
        round trip per shard): what the admin's dead-letter list shows and filters by."""
        return self.store.last_errors([_check_id(i) for i in message_ids])

    @_reaching_redis
    def deliver_now(self, message_ids: Sequence[str]) -> list[str]:
        """Pending messages made due now."""
        return self.store.promote([_check_id(i) for i in message_ids])

    def purge_garbage(self, *, buried_before_ms: int | None = None) -> int:
        """Delete every dead letter, or only those buried before ``buried_before_ms`` (on
        Redis's clock, as ``stats()["server_time_ms"]``: those an operator was shown);
        returns how many."""
        return self._drop_garbage(
            older_than_ms=None, keep_unannounced=False, buried_before_ms=buried_before_ms
        )

    def expire_garbage(self) -> int:
        """Delete dead letters older than GARBAGE_RETENTION whose exhaustion was announced."""
        retention = self.config.garbage_retention_ms
        if retention is None:
            return 0
        return self._drop_garbage(older_than_ms=retention, keep_unannounced=True)

    @_reaching_redis
    def _drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        keep_unannounced: bool,
        buried_before_ms: int | None = None,
    ) -> int:
        """In calls of GARBAGE_DROP_BATCH, each bounded; the dead letters one keeps (still
        unannounced) are passed over by the next, so they never hide those behind them."""
        total, kept = 0, 0
        while True:
            dropped, kept_now = self.store.drop_garbage(
                older_than_ms=older_than_ms,
                limit=GARBAGE_DROP_BATCH,
                keep_unannounced=keep_unannounced,
                offset=kept,
                buried_before_ms=buried_before_ms,
            )
            total += dropped
            kept += kept_now
            if dropped + kept_now < GARBAGE_DROP_BATCH:
                return total
