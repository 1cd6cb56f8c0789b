"""Ordered groups (issue #27) through the Queue API: ``send(group=...)``, ``send_many`` with
``Outgoing(group=...)``, the async twins, the module-level send, on_commit and the outbox;
bad groups refused before anything is written; a grouped message lives on its group's
shard. (The groups' semantics on every store: tests/test_groups_contract.py.)"""

import asyncio
from typing import Any

import pytest
from django.db import transaction

import delayqueue_django as delayqueue
from delayqueue_django import Outgoing
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.queue.group_options import GROUP_MAX_BYTES
from delayqueue_django.engine import BURY, NewMessage
from delayqueue_django.engine.sharding.placement import key_shard, shard_of
from delayqueue_django.exceptions import ConflictingOptions, InvalidGroup
from delayqueue_django.outbox.models import OutboxMessage
from delayqueue_django.outbox.relay import OutboxRelay
from tests.backends import REDIS_BACKENDS, one_shard
from tests.helpers import redis_store

LATER = 60  # seconds: a message that stays pending for the whole test


def handed_out(queue: Queue) -> list[str]:
    """One fetch's ids, acked at once."""
    deliveries = queue.store.fetch(10).deliveries
    queue.store.ack([(d.id, d.lease) for d in deliveries])
    return [d.id for d in deliveries]


def group_of(queue: Queue, message_id: str) -> str | None:
    stored = queue.peek(message_id)
    assert stored is not None
    return stored.group


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (42, "must be a str"),
        ("", "must not be empty"),
        ("x" * (GROUP_MAX_BYTES + 1), "at most 256"),
        ("é" * 129, "258 bytes"),
        ("\ud800", "lone surrogate"),
    ],
)
def test_a_bad_group_is_refused_and_nothing_is_written(
    queue: Queue, group: Any, message: str
) -> None:
    with pytest.raises(InvalidGroup, match=message):
        queue.send("x", group=group)
    with pytest.raises(InvalidGroup, match=message):
        queue.send_many(["ok", Outgoing("x", group=group)])
    assert queue.stats()["pending"] == 0


def test_the_longest_group_is_taken(queue: Queue) -> None:
    group = "é" * (GROUP_MAX_BYTES // 2)
    message_id = queue.send("x", group=group, delay=LATER)
    assert group_of(queue, message_id) == group


@one_shard
def test_a_key_and_a_group_together_are_taken(queue: Queue) -> None:
    first = queue.send({"n": 1}, key="k", group="g")
    second, third = queue.send_many(
        [Outgoing({"n": 2}, group="g"), Outgoing({"n": 3}, key="k", if_exists="replace")]
    )
    assert third == first  # the key's waiting message, replaced (and taken out of group g)
    found = queue.lookup("k")
    assert found is not None
    assert (found.id, found.group) == (first, None)
    assert group_of(queue, second) == "g"
    assert queue.cancel(key="k")


@one_shard
def test_a_keyed_replace_moves_its_message_to_the_group_it_names(queue: Queue) -> None:
    holder = queue.send({"n": 1}, group="a")
    keyed = queue.send({"n": 2}, key="k", group="a")
    assert handed_out(queue) == [holder]
    assert queue.send({"n": 3}, key="k", if_exists="replace", group="b") == keyed
    assert group_of(queue, keyed) == "b"
    assert handed_out(queue) == [keyed]


@pytest.mark.parametrize("backend_url", ["sharded-memory"], indirect=True)
def test_a_sharded_queue_refuses_a_key_with_a_group(queue: Queue) -> None:
    with pytest.raises(ConflictingOptions, match="has a key or a group, not both"):
        queue.send("x", key="k", group="g")
    with pytest.raises(ConflictingOptions, match="SHARDS=4"):
        queue.send_many(["ok", Outgoing("x", key="k", group="g")])
    with pytest.raises(ConflictingOptions):
        queue.send("x", key="k", group="g", outbox=True)
    assert queue.stats()["pending"] == 0
    # Either alone is taken, each on its shard.
    assert queue.lookup("k") is None
    keyed, grouped = queue.send("x", key="k"), queue.send("y", group="g")
    layout = queue.config.shards
    assert shard_of(keyed)[1] == key_shard("k", layout)
    assert shard_of(grouped)[1] == key_shard("g", layout)


@pytest.mark.parametrize("backend_url", ["sharded-memory"], indirect=True)
def test_a_sharded_store_refuses_a_keyed_grouped_message(queue: Queue) -> None:
    message = NewMessage("m", "{}", 2, key="k", group="g")
    with pytest.raises(ValueError, match="a key and a group"):
        queue.store.send_keyed([message])


def test_send_and_send_many_order_a_group(queue: Queue) -> None:
    first = queue.send({"n": 1}, group="customer:42")
    second, other, third = queue.send_many(
        [
            Outgoing({"n": 2}, group="customer:42"),
            Outgoing({"n": 1}, group="customer:7"),
            Outgoing({"n": 3}, group="customer:42"),
        ]
    )
    assert group_of(queue, first) == "customer:42"
    assert group_of(queue, other) == "customer:7"
    assert sorted(handed_out(queue)) == sorted([first, other])
    assert handed_out(queue) == [second]
    assert handed_out(queue) == [third]
    assert handed_out(queue) == []


def test_the_module_level_send_and_the_async_twins_take_a_group(queue: Queue) -> None:
    async def scenario() -> list[str]:
        return [
            await queue.asend("a", group="g"),
            await delayqueue.asend("b", group="g"),
            *(await queue.asend_many([Outgoing("c", group="g")])),
        ]

    ids = [delayqueue.send("first", group="g"), *asyncio.run(scenario())]
    assert [group_of(queue, message_id) for message_id in ids] == ["g"] * 4
    assert [handed_out(queue) for _ in ids] == [[message_id] for message_id in ids]


@pytest.mark.django_db(transaction=True)
def test_an_on_commit_send_keeps_its_group(queue: Queue) -> None:
    with transaction.atomic():
        message_id = queue.send("x", group="g", on_commit=True, delay=LATER)
        assert queue.peek(message_id) is None
    assert group_of(queue, message_id) == "g"


def test_the_outbox_row_keeps_the_group_and_the_relay_orders_it(database: str) -> None:
    queue = delayqueue.get_queue()
    with transaction.atomic(using=database):
        first = queue.send({"n": 1}, group="g", outbox=True, using=database)
        second = queue.send({"n": 2}, group="g", outbox=True, using=database)
        plain = queue.send({"n": 3}, outbox=True, using=database)
    groups = [row.message_group for row in OutboxMessage.objects.using(database).order_by("id")]
    assert groups == ["g", "g", None]
    OutboxRelay([queue], databases=[database]).drain()
    assert group_of(queue, first) == "g"
    assert group_of(queue, plain) is None
    assert sorted(handed_out(queue)) == sorted([first, plain])
    assert handed_out(queue) == [second]


@pytest.mark.parametrize("backend_url", ["sharded-memory"], indirect=True)
def test_a_grouped_message_lives_on_its_groups_shard(queue: Queue) -> None:
    layout = queue.config.shards
    for group in ("a", "b", "customer:42", "ü"):
        ids = [queue.send(n, group=group, delay=LATER) for n in range(3)]
        # Shard 0 is every layout's (its ids carry no mark): the index says it all.
        assert {shard_of(message_id)[1] for message_id in ids} == {key_shard(group, layout)}


@pytest.mark.parametrize("backend_url", REDIS_BACKENDS, indirect=True)
def test_on_redis_a_drained_group_leaves_nothing_but_its_counter(queue: Queue) -> None:
    """What the groups keep in Redis goes with their messages: acked, dead-lettered and
    purged, cancelled. A plain queue has none of it."""
    store = redis_store(queue)
    names = store.keys
    queue.send("plain")
    handed_out(queue)
    assert store.client.exists(names.key("group_of")) == 0
    ids = [queue.send(n, group="g", retry_count=0) for n in range(3)]
    queue.cancel(ids[2])
    [delivery] = queue.store.fetch(10).deliveries
    queue.store.nack([(delivery.id, delivery.lease, BURY)])
    assert handed_out(queue) == [ids[1]]
    queue.purge_garbage()
    assert store.client.hgetall(names.key("group_of")) == {b"": b"3"}
    assert store.client.exists(names.key("group_busy"), names.key("group:g")) == 0


def test_the_outbox_relays_a_keyed_message_into_its_group(database: str) -> None:
    queue = delayqueue.get_queue()
    holder = queue.send({"n": 0}, group="g")
    with transaction.atomic(using=database):
        keyed = queue.send({"n": 1}, key="k", group="g", outbox=True, using=database)
        queue.send({"n": 2}, key="k", if_exists="replace", group="h", outbox=True, using=database)
    OutboxRelay([queue], databases=[database]).drain()
    # Relayed in commit order: created in group g, then replaced into group h.
    assert group_of(queue, keyed) == "h"
    assert sorted(handed_out(queue)) == sorted([holder, keyed])
