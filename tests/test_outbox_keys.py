"""Keyed sends through the transactional outbox (issue #26): the relay decides each keyed
row's key when it writes the row to Redis, as a direct send would, in the rows' order, and
still writes each row at most once. The relay step itself on every store (Redis, Cluster,
memory, sharded), then the outbox on SQLite, PostgreSQL and MariaDB."""

import threading
import uuid
from typing import Any

import pytest
from django.db import connections, transaction

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
    row: tuple[str, int] | None = None,
) -> NewMessage:
    """A keyed message as an outbox row brings it to the relay: a new id placed on its
    key's shard (as send places it), an absolute due time, and its row (database, id)."""
    [message_id] = queue.store.place([uuid.uuid4().hex], [key])
    return NewMessage(
        message_id,
        payload,
        2,
        at_ms=at_ms,
        key=key,
        if_exists=if_exists,
        unique_ms=unique_ms,
        outbox_row=row,
    )


def replacing(queue: Queue, payload: str, row: int, database: str = "default") -> NewMessage:
    """A keyed row with if_exists="replace": row ``row`` of ``database``."""
    later = store_time_ms(queue) + LATER_MS
    return keyed_row(queue, payload, if_exists="replace", at_ms=later, row=(database, row))


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


# Rows that reach Redis out of their order (issue #33): relays take rows at once, and one
# that stalls between its take and its Redis call brings older rows after newer ones.


def test_a_replace_row_older_than_the_one_that_wrote_the_keys_message_writes_nothing(
    queue: Queue,
) -> None:
    newer = replacing(queue, '"newer"', row=8)
    [created] = relay(queue, newer)
    assert created is not None
    assert relay(queue, replacing(queue, '"older"', row=7)) == [None]
    assert payload_of(queue) == '"newer"'
    # A later row replaces, as ever; and then that one is the row to be older than.
    assert relay(queue, replacing(queue, '"nine"', row=9)) != [None]
    assert relay(queue, replacing(queue, '"ten"', row=10)) != [None]
    assert relay(queue, replacing(queue, '"stale"', row=9)) == [None]
    assert payload_of(queue) == '"ten"'
    found = queue.lookup(KEY)
    assert found is not None
    assert found.id == newer.id
    assert queue.stats()["pending"] == 1


def test_rows_out_of_order_in_one_call_are_decided_in_row_order(queue: Queue) -> None:
    newer, older = replacing(queue, '"newer"', row=2), replacing(queue, '"older"', row=1)
    first, second = relay(queue, newer, older)
    assert first is not None
    assert second is None
    assert payload_of(queue) == '"newer"'


def test_row_ids_are_compared_as_numbers_however_large(queue: Queue) -> None:
    relay(queue, replacing(queue, '"newer"', row=10**18))
    assert relay(queue, replacing(queue, '"older"', row=10**18 - 1)) == [None]
    assert relay(queue, replacing(queue, '"shorter"', row=99)) == [None]
    assert payload_of(queue) == '"newer"'


def test_an_older_replace_row_still_replaces_a_message_a_newer_keep_created(
    queue: Queue,
) -> None:
    """In row order the replace came first and the keep kept its message: its payload is
    the one to run."""
    later = store_time_ms(queue) + LATER_MS
    kept = keyed_row(queue, '"kept"', at_ms=later, row=("default", 2))
    relay(queue, kept)
    assert relay(queue, replacing(queue, '"replacing"', row=1)) != [None]
    assert payload_of(queue) == '"replacing"'
    # A keep never writes on a waiting message, older or newer.
    assert relay(queue, keyed_row(queue, '"older keep"', at_ms=later, row=("default", 0))) == [None]
    assert payload_of(queue) == '"replacing"'


def test_rows_of_different_databases_are_decided_as_they_come(queue: Queue) -> None:
    """Their ids are not comparable: each database's rows keep their own order, and rows
    of two databases take turns as they reach Redis."""
    relay(queue, replacing(queue, '"a5"', row=5, database="a"))
    assert relay(queue, replacing(queue, '"b1"', row=1, database="b")) != [None]
    assert payload_of(queue) == '"b1"'
    # Older than a's row 5, which wrote the message before b's row 1 replaced it.
    assert relay(queue, replacing(queue, '"a4"', row=4, database="a")) == [None]
    assert relay(queue, replacing(queue, '"b0"', row=0, database="b")) == [None]
    assert payload_of(queue) == '"b1"'
    assert relay(queue, replacing(queue, '"a6"', row=6, database="a")) != [None]
    assert payload_of(queue) == '"a6"'


def test_a_key_without_a_remembered_row_is_replaced_as_before(queue: Queue) -> None:
    """A message a direct send created, or one written before rows were remembered (by an
    older version, or a keep), has no row to be older than: any replace row replaces it."""
    waiting = queue.send("direct", key=KEY, delay=60)
    assert relay(queue, replacing(queue, '"relayed"', row=3)) != [None]
    assert payload_of(queue) == '"relayed"'
    # A direct replace is not ordered against the rows: it leaves what they remember.
    queue.send("direct again", key=KEY, if_exists="replace", delay=60)
    assert relay(queue, replacing(queue, '"older"', row=2)) == [None]
    assert payload_of(queue) == '"direct again"'
    assert queue.lookup(KEY).id == waiting  # type: ignore[union-attr]


def test_once_the_keys_message_started_an_older_row_creates_the_next_one(queue: Queue) -> None:
    """The rows remembered are the waiting message's: a key whose message is in flight or
    handled is free, for a relayed row as for a send."""
    created = keyed_row(queue, '"newer"', if_exists="replace", row=("default", 2))
    relay(queue, created)
    [message] = queue.fetch(10).messages
    assert message.id == created.id
    older = replacing(queue, '"older"', row=1)
    assert relay(queue, older) != [None]
    found = queue.lookup(KEY)
    assert found is not None
    assert found.id == older.id
    queue.ack([message])
    assert payload_of(queue) == '"older"'


def test_the_rows_remembered_for_a_key_leave_with_its_message(redis_queue: Queue, raw: Any) -> None:
    remembered = redis_queue.store.keys.key("key_rows")
    created = keyed_row(redis_queue, '"one"', if_exists="replace", row=("default", 1))
    relay(redis_queue, created)
    assert raw.hlen(remembered) == 1
    [message] = redis_queue.fetch(10).messages
    redis_queue.ack([message])
    assert not raw.exists(remembered)
    relay(redis_queue, replacing(redis_queue, '"two"', row=2))
    assert redis_queue.cancel(key=KEY)
    assert not raw.exists(remembered)


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


def test_two_relays_decide_a_keys_replaces_in_row_order_whatever_their_timing(
    queue: Queue, row_locking_database: str
) -> None:
    """Regression (#33): with SKIP LOCKED, a second relay took the newer row while the
    first still held the older one between its take and its Redis call (a GC pause, a
    reconnect, a starved CPU); the older replace landed last, and the key's waiting message
    ran the older payload. On every store, sharded queues included."""
    alias = row_locking_database
    for version in ("older", "newer"):
        queue.send(version, key=KEY, if_exists="replace", delay=60, outbox=True, using=alias)
    holding, release = threading.Event(), threading.Event()

    class StalledRelay(OutboxRelay):
        def _send(self, rows: list[Any]) -> list[Any]:
            holding.set()  # its rows taken, its Redis call not made yet
            release.wait(30)
            return super()._send(rows)

    stalled = StalledRelay([queue], databases=[alias], batch_size=1)

    def relay_the_older_row() -> None:
        try:
            stalled.relay_batch(alias)
        finally:
            connections.close_all()

    thread = threading.Thread(target=relay_the_older_row)
    thread.start()
    try:
        assert holding.wait(10)
        # The newer row, the older one being locked by the stalled relay.
        assert OutboxRelay([queue], databases=[alias]).relay_batch(alias) == 1
        assert payload_of(queue) == '"newer"'
    finally:
        release.set()
        thread.join(30)
    assert payload_of(queue) == '"newer"'
    assert stalled.repeated == 1  # decided: the waiting message already carries a later row
    assert queue.stats()["pending"] == 1
    assert rows(alias) == []


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
