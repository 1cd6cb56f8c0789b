"""``Queue``'s producer API: send, send_many and cancel, each send written now, at the
commit, or as an outbox row."""

from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction

from delayqueue_django.core import features, tracing
from delayqueue_django.core.encoding import due_spec, encode_payload, new_message_ids, retry_budget
from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue.base import QueueBase, _check_id, _reaching_redis
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.shards import place
from delayqueue_django.exceptions import ConflictingOptions


class QueueProducing(QueueBase):
    """Sending and cancelling."""

    # Producing

    def send(
        self,
        payload: Any,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
    ) -> str:
        """Schedule one message; returns its id. One round trip.

        ``on_commit`` (default: the queue's SEND_ON_COMMIT) writes it to Redis only when the
        current transaction on database ``using`` commits, and never if it rolls back; the id
        is returned at once all the same. ``outbox`` (default: the queue's OUTBOX) writes it
        instead as a row of that database's outbox table, in the transaction, for a relay to
        move to Redis once it committed (see delayqueue_django.outbox.table).
        """
        return self._send_all(
            [payload],
            batch=False,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
        )[0]

    def send_many(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
    ) -> list[str]:
        """Schedule many messages in one round trip; returns their ids in order.

        Items are payloads sharing the timing given here, or ``Outgoing`` objects carrying
        their own. Every item is validated before anything is written (or deferred); with
        ``outbox``, they are written as outbox rows, in INSERTs of at most 4 MiB each (see
        outbox.INSERT_BYTES) in the current transaction, or one of their own: all or none.
        """
        return self._send_all(
            messages,
            batch=True,
            delay=delay,
            at=at,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
        )

    def _send_all(
        self,
        messages: Iterable[Any],
        *,
        batch: bool,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
        on_commit: bool | None,
        using: str | None,
        outbox: bool | None,
    ) -> list[str]:
        """send_many's work; ``batch`` says whether the caller was a batch API (the tracing
        conventions name a batch's message count, and a single message's id)."""
        through_outbox = self._outbox(outbox, on_commit)
        prepared = self._prepare_all(messages, delay=delay, at=at, retry_count=retry_count)
        if not prepared:
            return []
        if tracing.active():
            with tracing.producer_span(self.name, prepared, batch=batch) as stamped:
                self._dispatch(stamped, through_outbox, on_commit, using)
        else:
            self._dispatch(prepared, through_outbox, on_commit, using)
        return [message.id for message in prepared]

    def _dispatch(
        self,
        prepared: list[NewMessage],
        through_outbox: bool,
        on_commit: bool | None,
        using: str | None,
    ) -> None:
        if through_outbox:
            features.outbox().write(self.name, prepared, using=using)
        elif self._on_commit(on_commit):
            # A delay still counts from when Redis receives the message, at the commit.
            transaction.on_commit(partial(self._write, prepared), using=using)
        else:
            self._write(prepared)

    @_reaching_redis
    def _write(self, prepared: list[NewMessage]) -> None:
        self.store.send(prepared)

    def _on_commit(self, on_commit: bool | None) -> bool:
        return self.config.send_on_commit if on_commit is None else on_commit

    def _outbox(self, outbox: bool | None, on_commit: bool | None) -> bool:
        """Whether a send goes through the outbox: ``outbox``, else (unless the call asks
        for ``on_commit``) the queue's OUTBOX. Asking for both is refused."""
        if outbox and on_commit:
            raise ConflictingOptions(
                "send(outbox=True, on_commit=True): choose one. The outbox writes the message "
                "in the transaction and a relay sends it after the commit, so it already "
                "waits for the commit, and survives Redis being away then."
            )
        if outbox is not None:
            return outbox
        return self.config.outbox and not on_commit

    def _prepare_all(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
    ) -> list[NewMessage]:
        """Validate and encode every message (payloads, or Outgoing with their own timing)."""
        items = list(messages)
        if not items:
            return []
        max_bytes, name = self.config.max_payload_bytes, self.name
        shared: tuple[int | None, int, int] | None = None  # the call's own timing, checked once
        prepared = []
        # Each id's shard is chosen from the settings' layout, as the store would: an outbox
        # send touches no Redis, nor builds its client.
        ids = place(new_message_ids(len(items)), self.config.shards)
        for message_id, item in zip(ids, items, strict=True):
            if isinstance(item, Outgoing):
                at_ms, delay_us, budget = self._timing(item.delay, item.at, item.retry_count)
                payload = item.payload
            else:
                if shared is None:
                    shared = self._timing(delay, at, retry_count)
                at_ms, delay_us, budget = shared
                payload = item
            text = encode_payload(payload, max_bytes=max_bytes, queue=name)
            prepared.append(NewMessage(message_id, text, budget, at_ms, delay_us))
        return prepared

    def _timing(
        self, delay: float | timedelta | None, at: datetime | None, retry_count: int | None
    ) -> tuple[int | None, int, int]:
        at_ms, delay_us = due_spec(delay, at)
        return at_ms, delay_us, retry_budget(retry_count, self.config.retry_count)

    @_reaching_redis
    def cancel(self, message_id: str) -> bool:
        """True if the message was waiting and now will never be delivered.

        False if the queue does not know it, or it is in flight, already handled or dead.
        """
        return self.store.remove(_check_id(message_id)) is not None
