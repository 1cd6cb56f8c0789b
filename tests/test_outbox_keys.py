"""Keyed sends through the transactional outbox (issue #26): the relay decides each keyed
row's key when it writes the row to Redis, as a direct send would, in the rows' order, and
still writes each row at most once. The relay step itself on every store (Redis, Cluster,
memory, sharded), then the outbox on SQLite, PostgreSQL and MariaDB."""

import uuid
from typing import Any

import pytest
from django.db import transaction

import delayqueue_django as delayqueue
from delayqueue_django import Outgoing
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.exceptions import ConflictingOptions, DuplicateKey
from delayqueue_django.outbox.models import OutboxMessage
from delayqueue_django.outbox.relay import RELAY_RECORD_MS, OutboxRelay
from delayqueue_django.outbox.table import ROW_BYTES, chunks_of
from tests.helpers import store_time_ms

KEY = "order-42-expiry"
KEEP_MS = 60_000
LATER_MS = 60_000


def keyed_row(
    queue: Queue,
    payload: str,
    *,
    key: str = KEY,
    if_exists: str = "keep",
    unique_ms: int = 0,
    at_ms: int = 0,
) -> NewMessage:
    """A keyed message as an outbox row brings it to the relay: a new id placed on its
    key's shard (as send places it), an absolute due time."""
    [message_id] = queue.store.place([uuid.uuid4().hex], [key])
    return NewMessage(
        message_id, payload, 2, at_ms=at_ms, key=key, if_exists=if_exists, unique_ms=unique_ms
    )


def relay(queue: Queue, *messages: NewMessage) -> list[int | None]:
    return queue.store.relay(list(messages), forget=[], keep_ms=KEEP_MS)


def payload_of(queue: Queue, key: str = KEY) -> str | None:
    found = queue.lookup(key)
    if found is None:
        return None
    stored = queue.peek(found.id)
    return None if stored is None else stored.payload


# The relay step, on every store


def test_relayed_keyed_rows_are_decided_in_their_order(queue: Queue) -> None:
    later = store_time_ms(queue) + LATER_MS
    first = keyed_row(queue, '"first"', at_ms=later)
    kept = keyed_row(queue, '"kept"', at_ms=later)
    replacing = keyed_row(queue, '"replacing"', if_exists="replace", at_ms=later + 1000)
    dues = relay(queue, first, kept, replacing)
    # Created; kept (nothing written); replaced (the first message's new due time).
    assert dues == [later, None, later + 1000]
    found = queue.lookup(KEY)
    assert found is not None
    assert (found.id, found.state, found.score_ms) == (first.id, "pending", later + 1000)
    assert payload_of(queue) == '"replacing"'
    assert queue.peek(kept.id) is None
    assert queue.peek(replacing.id) is None
    assert queue.stats()["pending"] == 1


def test_a_keyed_row_meeting_the_keys_waiting_message_with_keep_writes_nothing(
    queue: Queue,
) -> None:
    waiting = queue.send("direct", key=KEY, delay=60)
    before = queue.peek(waiting)
    assert before is not None
    row = keyed_row(queue, '"relayed"', at_ms=store_time_ms(queue))
    assert relay(queue, row) == [None]
    after = queue.peek(waiting)
    assert after is not None
    assert (after.payload, after.score_ms) == ('"direct"', before.score_ms)
    assert queue.peek(row.id) is None
    assert queue.stats()["pending"] == 1


def test_a_keyed_row_replacing_a_due_message_puts_it_back_in_pending(queue: Queue) -> None:
    waiting = queue.send("due", key=KEY)
    queue.fetch(0)  # staged in ready, handed nothing out
    later = store_time_ms(queue) + LATER_MS
    row = keyed_row(queue, '"later"', if_exists="replace", at_ms=later)
    assert relay(queue, row) == [later]
    stored = queue.peek(waiting)
    assert stored is not None
    assert (stored.state, stored.score_ms, stored.payload) == ("pending", later, '"later"')
    assert queue.fetch(10).messages == []


def test_keyed_rows_relayed_again_are_decided_once(queue: Queue) -> None:
    """A relay that died before its delete committed brings the same rows again: each row
    was decided when Redis first accepted it, and is not decided again, even once the
    messages it made were handled."""
    created = keyed_row(queue, '"one"')
    replacing = keyed_row(queue, '"two"', if_exists="replace")
    first, second = relay(queue, created, replacing)
    assert first is not None
    assert second is not None
    assert relay(queue, created, replacing) == [None, None]
    [message] = queue.fetch(10).messages
    assert (message.id, message.payload) == (created.id, "two")
    queue.ack([message])
    # The key is free again, but the rows were relayed before: nothing is written.
    assert relay(queue, created, replacing) == [None, None]
    assert queue.lookup(KEY) is None
    assert queue.stats()["pending"] == 0


def test_a_keyed_row_with_unique_ms_holds_the_key_after_its_message_left(
    queue: Queue,
) -> None:
    holder = keyed_row(queue, '"held"', unique_ms=LATER_MS)
    assert relay(queue, holder) != [None]
    [message] = queue.fetch(10).messages
    queue.ack([message])
    assert relay(queue, keyed_row(queue, '"again"', if_exists="replace")) == [None]
    assert queue.stats()["pending"] == 0
    # Another key is not held.
    assert relay(queue, keyed_row(queue, '"other"', key="other")) != [None]


def test_plain_and_keyed_rows_relay_side_by_side(queue: Queue) -> None:
    later = store_time_ms(queue) + LATER_MS
    [plain] = queue.store.place([uuid.uuid4().hex])
    rows = [
        keyed_row(queue, '"a"', at_ms=later),
        NewMessage(plain, '"plain"', 2, at_ms=later),
        keyed_row(queue, '"b"', at_ms=later),
    ]
    assert relay(queue, *rows) == [later, later, None]
    assert queue.peek(plain) is not None
    assert queue.stats()["pending"] == 2


def test_a_relay_refuses_a_keyed_row_whose_if_exists_is_error(queue: Queue) -> None:
    row = keyed_row(queue, '"x"', if_exists="error", at_ms=store_time_ms(queue))
    with pytest.raises(ValueError, match="if_exists='error'"):
        relay(queue, row)
    assert queue.stats()["pending"] == 0


# Through the outbox tables


def rows(alias: str) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.using(alias).order_by("id"))


def drain(alias: str) -> OutboxRelay:
    relay = OutboxRelay([delayqueue.get_queue()], databases=[alias])
    relay.drain()
    return relay


def test_the_row_keeps_the_key_and_its_options(database: str) -> None:
    delayqueue.send("x", key=KEY, if_exists="replace", unique_for=2.5, outbox=True, using=database)
    delayqueue.send("plain", outbox=True, using=database)
    keyed, plain = rows(database)
    assert (keyed.message_key, keyed.if_exists, keyed.unique_ms) == (KEY, "replace", 2500)
    assert (plain.message_key, plain.if_exists, plain.unique_ms) == (None, "keep", 0)


def test_keep_and_replace_through_the_outbox(database: str) -> None:
    queue = delayqueue.get_queue()
    with transaction.atomic(using=database):
        first = queue.send({"v": 1}, key=KEY, delay=60, outbox=True, using=database)
        queue.send({"v": 2}, key=KEY, delay=60, outbox=True, using=database)
    relay = drain(database)
    assert (relay.relayed, relay.repeated) == (1, 1)
    assert payload_of(queue) == '{"v":1}'
    found = queue.lookup(KEY)
    assert found is not None
    assert found.id == first

    queue.send({"v": 3}, key=KEY, if_exists="replace", delay=120, outbox=True, using=database)
    drain(database)
    found = queue.lookup(KEY)
    assert found is not None
    assert found.id == first
    assert payload_of(queue) == '{"v":3}'
    assert queue.stats()["pending"] == 1
    assert rows(database) == []


def test_of_two_transactions_with_one_key_the_later_commit_replaces(database: str) -> None:
    queue = delayqueue.get_queue()
    for version in (1, 2):
        with transaction.atomic(using=database):
            queue.send(
                {"v": version}, key=KEY, if_exists="replace", delay=60, outbox=True, using=database
            )
    drain(database)
    assert payload_of(queue) == '{"v":2}'
    assert queue.stats()["pending"] == 1


def test_a_rolled_back_keyed_send_decides_nothing(database: str) -> None:
    queue = delayqueue.get_queue()
    queue.send({"v": 1}, key=KEY, delay=60, outbox=True, using=database)
    with transaction.atomic(using=database):
        queue.send({"v": 2}, key=KEY, if_exists="replace", outbox=True, using=database)
        transaction.set_rollback(True, using=database)
    drain(database)
    assert payload_of(queue) == '{"v":1}'


def test_unique_for_through_the_outbox(database: str) -> None:
    queue = delayqueue.get_queue()
    holder = queue.send("first", key=KEY, unique_for=60, outbox=True, using=database)
    drain(database)
    [message] = queue.fetch(10).messages
    assert message.id == holder
    queue.ack([message])
    # Handled: the key is free of waiting messages, but held for a minute.
    queue.send("second", key=KEY, if_exists="replace", outbox=True, using=database)
    relay = drain(database)
    assert (relay.relayed, relay.repeated) == (0, 1)
    assert queue.stats()["pending"] == 0
    assert queue.lookup(KEY) is None


def test_keyed_rows_relayed_again_write_once(database: str) -> None:
    """The relay died after Redis accepted its batch, before its delete committed: the next
    relay brings the same rows, and writes nothing of them again."""
    queue = delayqueue.get_queue()
    queue.send("one", key=KEY, delay=60, outbox=True, using=database)
    queue.send("two", key=KEY, if_exists="replace", delay=60, outbox=True, using=database)
    messages = [
        NewMessage(
            row.message_id,
            row.payload,
            row.retry_count,
            at_ms=row.due_ms,
            key=row.message_key,
            if_exists=row.if_exists,
            unique_ms=row.unique_ms,
        )
        for row in rows(database)
    ]
    # What the dead relay got done: Redis accepted the rows.
    assert None not in queue.store.relay(messages, forget=[], keep_ms=RELAY_RECORD_MS)
    relay = drain(database)
    assert (relay.relayed, relay.repeated) == (0, 2)
    assert rows(database) == []
    assert payload_of(queue) == '"two"'
    assert queue.stats()["pending"] == 1


def test_a_keyed_row_relayed_while_the_keys_message_waits_keeps_it(database: str) -> None:
    queue = delayqueue.get_queue()
    waiting = queue.send("direct", key=KEY, delay=60)
    returned = queue.send("through the outbox", key=KEY, outbox=True, using=database)
    # Decided at the relay, not at the call: the id returned is the row's own.
    assert returned != waiting
    relay = drain(database)
    assert (relay.relayed, relay.repeated) == (0, 1)
    assert queue.peek(returned) is None
    assert payload_of(queue) == '"direct"'


def test_the_outbox_refuses_if_exists_error(database: str) -> None:
    queue = delayqueue.get_queue()
    with pytest.raises(ConflictingOptions, match="relay decides the key"):
        queue.send("keyed", key=KEY, if_exists="error", outbox=True, using=database)
    keyed = Outgoing("keyed", key=KEY, if_exists="error")
    with pytest.raises(ConflictingOptions, match="relay decides the key"):
        queue.send_many(["plain", keyed], outbox=True, using=database)
    assert rows(database) == []


def test_on_commit_in_a_transaction_refuses_if_exists_error(database: str) -> None:
    queue = delayqueue.get_queue()
    with (
        transaction.atomic(using=database),
        pytest.raises(ConflictingOptions, match="raised from the commit"),
    ):
        queue.send("keyed", key=KEY, if_exists="error", on_commit=True, using=database)
    assert queue.stats()["pending"] == 0


def test_on_commit_outside_a_transaction_decides_the_key_at_once(
    database: str, settings: Any
) -> None:
    """Outside a transaction Django runs a commit callback at once: the refusal reaches
    the caller, so "error" is allowed."""
    queue = delayqueue.get_queue()
    queue.send("first", key=KEY, delay=60)
    with pytest.raises(DuplicateKey):
        queue.send("second", key=KEY, if_exists="error", on_commit=True, using=database)
    assert payload_of(queue) == '"first"'


def test_an_inserts_size_counts_the_keys_bytes() -> None:
    key = "é" * 128  # 256 bytes in UTF-8
    messages = [NewMessage(f"id{n}", "x", 0, at_ms=0, key=key) for n in range(2)]
    # Room for two rows without their keys, not with them.
    limit = 2 * (ROW_BYTES + 3 + 1) + 256
    assert [len(run) for run in chunks_of(messages, limit)] == [1, 1]
    assert [len(run) for run in chunks_of(messages, limit + 256)] == [2]
