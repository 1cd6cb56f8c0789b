"""Expiring sends through the transactional outbox and at the commit (issue #27): an
outbox row keeps its message's expiry, as an absolute time fixed when it was written, and
the relay writes it with the message; a row relayed at or after its expiry is never
refused (a relay has no caller to refuse to) but dead-lettered as expired by the first
fetch. The relay step on every store, then the outbox on each database."""

import uuid
from datetime import timedelta

import pytest
from django.db import transaction

import delayqueue_django as delayqueue
from delayqueue_django import Outgoing
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import EXPIRED, NewMessage
from delayqueue_django.exceptions import InvalidExpiry
from delayqueue_django.outbox.models import OutboxMessage
from delayqueue_django.outbox.relay import OutboxRelay
from tests.helpers import store_time_ms, wait_for

KEEP_MS = 60_000


def outlive(queue: Queue, ms: int) -> None:
    until = store_time_ms(queue) + ms
    wait_for(lambda: store_time_ms(queue) > until, what="the store's clock")


def relay(queue: Queue, *messages: NewMessage) -> list[int | None]:
    return queue.store.relay(list(messages), forget=[], keep_ms=KEEP_MS)


def row(queue: Queue, *, at_ms: int, expires_ms: int, key: str | None = None) -> NewMessage:
    [message_id] = queue.store.place([uuid.uuid4().hex], [key])
    return NewMessage(message_id, '"x"', 2, at_ms=at_ms, key=key, expires_at_ms=expires_ms)


# The relay step, on every store


@pytest.mark.parametrize("key", [None, "order-42"])
def test_a_row_relayed_after_its_expiry_is_written_and_expires_at_once(
    queue: Queue, key: str | None
) -> None:
    now = store_time_ms(queue)
    late = row(queue, at_ms=now - 2000, expires_ms=now - 1000, key=key)
    [due] = relay(queue, late)
    assert due is not None
    assert due >= now  # written, due now (its time passed)
    assert queue.fetch(1).messages == []
    stored = queue.peek(late.id)
    assert stored is not None
    assert (stored.state, stored.dead_reason) == ("garbage", EXPIRED)


def test_a_row_relayed_before_its_expiry_is_handed_out(queue: Queue) -> None:
    now = store_time_ms(queue)
    timely = row(queue, at_ms=now, expires_ms=now + 60_000)
    relay(queue, timely)
    [message] = queue.fetch(1).messages
    assert message.id == timely.id


# Through the outbox tables


def rows(alias: str) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.using(alias).order_by("id"))


def drain(alias: str) -> None:
    OutboxRelay([delayqueue.get_queue()], databases=[alias]).drain()


def test_the_row_keeps_the_expiry_as_an_absolute_time(database: str) -> None:
    delayqueue.send("x", delay=10, expires=timedelta(minutes=1), outbox=True, using=database)
    delayqueue.send("plain", outbox=True, using=database)
    expiring, plain = rows(database)
    assert expiring.expires_ms is not None
    assert expiring.expires_ms - expiring.due_ms == 50_000
    assert plain.expires_ms is None


def test_an_outbox_send_expires_as_a_direct_one(database: str) -> None:
    queue = delayqueue.get_queue()
    with transaction.atomic(using=database):
        expiring = queue.send({"n": 1}, expires=0.05, outbox=True, using=database)
        lasting = queue.send_many([Outgoing({"n": 2}, expires=60)], outbox=True, using=database)
    outlive(queue, 100)
    drain(database)
    assert [message.id for message in queue.fetch(10).messages] == lasting
    stored = queue.peek(expiring)
    assert stored is not None
    assert stored.dead_reason == EXPIRED


def test_a_bad_expiry_is_refused_before_any_row_is_written(database: str) -> None:
    with pytest.raises(InvalidExpiry):
        delayqueue.send("x", delay=60, expires=30, outbox=True, using=database)
    assert rows(database) == []


def test_an_on_commit_send_keeps_its_expiry(database: str) -> None:
    queue = delayqueue.get_queue()
    with transaction.atomic(using=database):
        message_id = queue.send({"n": 1}, expires=0.05, on_commit=True, using=database)
        assert queue.peek(message_id) is None
    outlive(queue, 100)
    assert queue.fetch(1).messages == []
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.dead_reason == EXPIRED
