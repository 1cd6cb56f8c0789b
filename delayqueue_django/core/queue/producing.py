"""``Queue``'s producer API: send, send_many, cancel and reschedule, each send written now,
at the commit, or as an outbox row."""

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Never

from django.db import transaction

from delayqueue_django.core import features, tracing
from delayqueue_django.core.encoding import (
    due_spec,
    encode_payload,
    new_message_id,
    new_message_ids,
    retry_budget,
)
from delayqueue_django.core.expiry import expiry_spec
from delayqueue_django.core.outgoing import Outgoing, refuse_call_options
from delayqueue_django.core.queue.base import QueueBase, _check_address, _reaching_redis
from delayqueue_django.core.queue.group_options import check_group, check_key_and_group
from delayqueue_django.core.queue.key_options import (
    KEEP,
    UNKEYED,
    key_fields,
    refuse_deferred_error,
)
from delayqueue_django.engine import KeyedSent, NewMessage
from delayqueue_django.engine.sharding.placement import key_shard, place, with_shard
from delayqueue_django.exceptions import ConflictingOptions, DelayQueueError

# A message's timing for NewMessage: at_ms, delay_us, budget, expires_at_ms, expires_in_us.
Timing = tuple[int | None, int, int, int | None, int]


def timing_only(
    key: object,
    group: object,
    expires: object,
    on_commit: object,
    outbox: object,
    unique_for: object,
    if_exists: str,
) -> bool:
    """Whether a send was given none of its options but the timing (its payload may still
    be an Outgoing, or its queue send through the outbox: see _plain_message)."""
    return (
        key is None
        and group is None
        and expires is None
        and on_commit is None
        and outbox is None
        and unique_for is None
        and if_exists == KEEP
    )


class QueueProducing(QueueBase):
    """Sending, cancelling and rescheduling."""

    # Producing

    def send(
        self,
        payload: Any,
        *,
        key: str | None = None,
        if_exists: str = KEEP,
        unique_for: float | timedelta | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
        group: str | None = None,
    ) -> str:
        """Schedule one message; returns its id. One round trip.

        ``key`` (a non-empty str of at most 256 bytes in UTF-8, any characters) addresses
        the message by a name of the caller's, unique per queue: at most one message per key
        *waits* (pending, due, or waiting for its retry). When one waits already,
        ``if_exists`` says what this send does: ``"keep"`` (the default) sends nothing and
        returns the waiting message's id; ``"replace"`` gives that message this payload, due
        time and retry budget, keeps its id and returns it; ``"error"`` raises
        ``DuplicateKey``. A key whose message is in flight or handled is free: the send
        creates a new message. ``unique_for`` (seconds or a timedelta, rounded up to the ms)
        also holds the key for that long after the send that creates its message, whatever
        becomes of the message: a send with the key meanwhile sends nothing and returns the
        holder's id (``"error"``: raises DuplicateKey). A kept or held send does not extend
        the hold. A bad key raises InvalidKey, a bad ``if_exists`` or ``unique_for``
        InvalidKeyOption (an InvalidKey too; either without a key: ConflictingOptions),
        with nothing written.

        ``on_commit`` (default: the queue's SEND_ON_COMMIT) writes it to Redis only when the
        current transaction on database ``using`` commits, and never if it rolls back; the id
        is returned at once all the same. With a key, what the key holds is decided at the
        commit: the id returned is then the new message's, which names nothing if the key
        kept or held its own message. ``outbox`` (default: the queue's OUTBOX) writes it
        instead as a row of that database's outbox table, in the transaction, for a relay
        to move to Redis once it committed (see delayqueue_django.outbox.table), which
        decides the key then, in the rows' order; the id returned is likewise the new
        message's. Neither can raise DuplicateKey to the caller: ``if_exists="error"`` with
        the outbox, or with ``on_commit`` inside a transaction, raises ConflictingOptions,
        with nothing written.

        ``group`` (a non-empty str of at most 256 bytes in UTF-8, e.g. ``"customer:42"``)
        orders the message within that group: the messages of one group are handed out one
        at a time, in due-time order (equal due times in send order), each only once the one
        before is acked or dead-lettered. A failing message holds its group through its
        retries, as in SQS FIFO: the next waits until it succeeds or is dead-lettered.
        Other groups and ungrouped messages are never held up. A bad group raises
        InvalidGroup. With a key too, the message joins its group as any send does; a
        replace gives the key's waiting message this group (leaving the one it had, which
        passes on if it held it) and a place by its new due time, as the latest send; a
        keyed message superseded while it held its group passes the group on. A queue of
        more than one shard refuses a key with a group (ConflictingOptions).
        ``expires`` (seconds or a timedelta counted from the send on Redis's clock, as a
        delay is, or a datetime; default: the queue's EXPIRES, counted from the due time):
        a message not handed out by then is never handed out. It is dead-lettered with the
        reason "expired" and ``message_expired`` is sent; a retry or postpone that would
        come at or after it expires the message instead. An expiry in the past, or not
        after the due time, raises InvalidExpiry with nothing written.
        """
        if timing_only(key, group, expires, on_commit, outbox, unique_for, if_exists):
            plain = self._plain_message(payload, delay, at, retry_count)
            if plain is not None:
                return self._write_plain(plain)
        return self._send_all(
            [payload],
            batch=False,
            delay=delay,
            at=at,
            expires=expires,
            retry_count=retry_count,
            on_commit=on_commit,
            using=using,
            outbox=outbox,
            keyed=key_fields(key, if_exists, unique_for),
            group=check_group(group),
        )[0]

    def _plain_message(
        self,
        payload: Any,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
    ) -> NewMessage | None:
        """A send given none of the options but its timing: its message, checked as
        _prepare_all checks it, when the queue writes it now as it is (no SEND_ON_COMMIT,
        OUTBOX or EXPIRES, no tracer provider, a payload that is no Outgoing); else None,
        for _send_all. The path of a
        send per message, which pays for no option it does not use (each a few µs)."""
        config = self.config
        if config.send_on_commit or config.outbox or config.expires_ms is not None:
            return None
        if isinstance(payload, Outgoing):  # its own timing, key, group: _prepare_all's
            return None
        if tracing.active():
            return None
        at_ms, delay_us = due_spec(delay, at)
        budget = retry_budget(retry_count, config.retry_count)
        text = encode_payload(payload, max_bytes=config.max_payload_bytes, queue=self.name)
        message_id = new_message_id()
        if config.shards > 1:
            (message_id,) = place([message_id], config.shards)
        return NewMessage(message_id, text, budget, at_ms, delay_us)

    @_reaching_redis
    def _write_plain(self, message: NewMessage) -> str:
        """_write's work for one plain message (see _plain_message)."""
        with refusals_worded_for(batch=False):
            self.store.send((message,))
        return message.id

    def send_many(
        self,
        messages: Iterable[Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        retry_count: int | None = None,
        on_commit: bool | None = None,
        using: str | None = None,
        outbox: bool | None = None,
        **per_message: Never,
    ) -> list[str]:
        """Schedule many messages in one round trip; returns their ids in order.

        Items are payloads sharing the timing given here, or ``Outgoing`` objects carrying
        their own. Every item is validated before anything is written (or deferred); with
        ``outbox``, they are written as outbox rows, in INSERTs of at most 4 MiB each (see
        outbox.INSERT_BYTES) in the current transaction, or one of their own: all or none.

        Keys are given per item, on ``Outgoing`` (one key for many payloads would keep or
        replace all but one of them): each item's id is then the one its key names, as
        ``send`` returns it. Keyed items are decided in order, each seeing the earlier ones,
        and written before the unkeyed ones, in a round trip of their own: an
        ``if_exists="error"`` refusal (DuplicateKey) writes nothing of the call (on a
        sharded queue, nothing of the refused item's shard: items bound for other shards
        before it stay written, see engine.sharding.store). So is a group: ``key``,
        ``if_exists``, ``unique_for`` or ``group`` given to the call raises TypeError
        saying to give them on each ``Outgoing``.
        """
        refuse_call_options("send_many", per_message)
        return self._send_all(
            messages,
            batch=True,
            delay=delay,
            at=at,
            expires=expires,
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
        keyed: tuple[str | None, str, int] = UNKEYED,
        group: str | None = None,
        expires: float | timedelta | datetime | None = None,
    ) -> list[str]:
        """send_many's work; ``batch`` says whether the caller was a batch API (the tracing
        conventions name a batch's message count, and a single message's id). ``keyed``
        and ``group``: the key fields and group of send's one payload (checked)."""
        through_outbox = self._outbox(outbox, on_commit)
        prepared = self._prepare_all(
            messages,
            delay=delay,
            at=at,
            retry_count=retry_count,
            keyed=keyed,
            group=group,
            expires=expires,
        )
        if not prepared:
            return []
        refuse_deferred_error(prepared, self._deferred(through_outbox, on_commit, using))
        if tracing.active():
            with tracing.producer_span(self.name, prepared, batch=batch) as stamped:
                return self._dispatch(stamped, through_outbox, on_commit, using, batch)
        return self._dispatch(prepared, through_outbox, on_commit, using, batch)

    def _dispatch(
        self,
        prepared: list[NewMessage],
        through_outbox: bool,
        on_commit: bool | None,
        using: str | None,
        batch: bool,
    ) -> list[str]:
        """Write (or defer) the messages; their ids, as the keys named them when written
        now, else the new ones. ``batch``: as for _send_all."""
        if through_outbox:
            features.outbox().write(self.name, prepared, using=using)
        elif self._on_commit(on_commit):
            # A delay still counts from when Redis receives the message, at the commit.
            transaction.on_commit(partial(self._write, prepared, batch=batch), using=using)
        else:
            return self._write(prepared, batch=batch)
        return [message.id for message in prepared]

    @_reaching_redis
    def _write(self, prepared: list[NewMessage], *, batch: bool = True) -> list[str]:
        """Write the messages now; returns each one's id (a keyed one's: its key's).
        ``batch``: as for _send_all."""
        with refusals_worded_for(batch):
            return self._write_keyed_first(prepared)

    def _write_keyed_first(self, prepared: list[NewMessage]) -> list[str]:
        keyed = [message for message in prepared if message.key is not None]
        if not keyed:
            self.store.send(prepared)
            return [message.id for message in prepared]
        # The keyed ones first: an if_exists="error" refusal then leaves nothing written.
        sent = self.store.send_keyed(keyed)
        plain = [message for message in prepared if message.key is None]
        if plain:
            self.store.send(plain)
        return _named_ids(prepared, sent)

    def _deferred(
        self, through_outbox: bool, on_commit: bool | None, using: str | None
    ) -> str | None:
        """How the messages' keys are decided after the call returns: "outbox", "on_commit"
        (inside a transaction: outside one, Django runs an on_commit callback at once), or
        None when they are decided now."""
        if through_outbox:
            return "outbox"
        if self._on_commit(on_commit) and transaction.get_connection(using).in_atomic_block:
            return "on_commit"
        return None

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
        keyed: tuple[str | None, str, int] = UNKEYED,
        group: str | None = None,
        expires: float | timedelta | datetime | None = None,
    ) -> list[NewMessage]:
        """Validate and encode every message (payloads, or Outgoing with their own timing,
        key and group). ``keyed`` and ``group``: those of the payloads given bare (send's
        one)."""
        items = list(messages)
        if not items:
            return []
        max_bytes, name = self.config.max_payload_bytes, self.name
        shared: Timing | None = None  # the call's own timing, checked once
        prepared = []
        # Each id's shard is chosen from the settings' layout, as the store would: an outbox
        # send touches no Redis, nor builds its client.
        layout = self.config.shards
        ids = place(new_message_ids(len(items)), layout)
        for message_id, item in zip(ids, items, strict=True):
            if isinstance(item, Outgoing):
                timing = self._timing(item.delay, item.at, item.retry_count, item.expires)
                payload = item.payload
                key, if_exists, unique_ms = key_fields(item.key, item.if_exists, item.unique_for)
                item_group = check_group(item.group)
            else:
                if shared is None:
                    shared = self._timing(delay, at, retry_count, expires)
                timing = shared
                payload = item
                key, if_exists, unique_ms = keyed
                item_group = group
            text = encode_payload(payload, max_bytes=max_bytes, queue=name)
            at_ms, delay_us, budget, expires_at_ms, expires_in_us = timing
            if key is None and item_group is None and expires_at_ms is None and not expires_in_us:
                # (Positional, as before the options: keywords cost a plain send_many ~1 µs each.)
                prepared.append(NewMessage(message_id, text, budget, at_ms, delay_us))
                continue
            # A keyed or grouped message lives on its key's or group's shard, where they are
            # decided: its id says so from the start, as an on_commit or outbox send returns
            # it at once. (A message with both is on a queue of one shard: there is no choice.)
            if key is not None and item_group is not None:
                check_key_and_group(name, layout)
            placed_by = key if key is not None else item_group
            if placed_by is not None:
                message_id = with_shard(message_id, layout, key_shard(placed_by, layout))
            prepared.append(
                NewMessage(
                    message_id,
                    text,
                    budget,
                    at_ms,
                    delay_us,
                    key=key,
                    if_exists=if_exists,
                    unique_ms=unique_ms,
                    group=item_group,
                    expires_at_ms=expires_at_ms,
                    expires_in_us=expires_in_us,
                )
            )
        return prepared

    def _timing(
        self,
        delay: float | timedelta | None,
        at: datetime | None,
        retry_count: int | None,
        expires: float | timedelta | datetime | None,
    ) -> "Timing":
        at_ms, delay_us = due_spec(delay, at)
        expires_at_ms, expires_in_us = expiry_spec(expires, at_ms, delay_us, self.config.expires_ms)
        budget = retry_budget(retry_count, self.config.retry_count)
        return at_ms, delay_us, budget, expires_at_ms, expires_in_us

    @_reaching_redis
    def cancel(self, message_id: str | None = None, *, key: str | None = None) -> bool:
        """True if the message was waiting and now will never be delivered.

        False if the queue does not know it, or it is in flight, already handled or dead.
        Give its id, or ``key=`` for the key's waiting message (not both). A ``unique_for``
        hold on the key outlasts the cancel: it is about sends, not about the message.
        """
        address, by_key = _check_address("cancel", message_id, key)
        if by_key:
            return self.store.cancel_key(address) is not None
        return self.store.remove(address) is not None

    @_reaching_redis
    def reschedule(
        self,
        message_id: str | None = None,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Give a waiting message a new due time: True if it was changed, False if no
        message waits under that id or key (in flight, dead, handled or unknown: nothing
        changed). Give its id, or ``key=`` for the key's waiting message (not both).

        ``delay`` and ``at`` follow ``send``'s rules (a delay counts from Redis's clock;
        neither: due now). Its attempt and retry budget stay as they were. Atomic against
        the workers: a message is never both handed out and rescheduled.
        """
        address, by_key = _check_address("reschedule", message_id, key)
        at_ms, delay_us = due_spec(delay, at)
        due = self.store.reschedule(
            message_id=None if by_key else address,
            key=address if by_key else None,
            at_ms=at_ms,
            delay_us=delay_us,
        )
        return due is not None


@contextmanager
def refusals_worded_for(batch: bool) -> Iterator[None]:
    """The store words a refusal for the batch of messages it refused ("nothing in its
    batch was written"); a single send's batch was its one message, and the caller knows
    of no other: "nothing was written"."""
    try:
        yield
    except DelayQueueError as error:
        if not batch:
            _worded_for_one(error)
        raise


def _worded_for_one(error: DelayQueueError) -> DelayQueueError:
    """``error`` worded for a single send (see refusals_worded_for)."""
    error.args = tuple(
        _IN_ITS_BATCH.sub("nothing was written", arg) if isinstance(arg, str) else arg
        for arg in error.args
    )
    return error


# How the stores end a refusal's message (engine.errors, engine.store, the memory store).
_IN_ITS_BATCH = re.compile(r"nothing in (?:its|their) batch was written")


def _named_ids(prepared: list[NewMessage], sent: list[KeyedSent]) -> list[str]:
    """Each message's id as its send returns it: a keyed one's is the id its key named
    (``sent``, the keyed messages' replies in order), another's its own."""
    named = iter(sent)
    return [message.id if message.key is None else next(named).id for message in prepared]
