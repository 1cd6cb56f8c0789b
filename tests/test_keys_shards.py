"""Keyed messages on a sharded queue (issue #26): a key's shard follows from the key, so one
shard decides each keyed send, lookup, cancel and reschedule; and through a change of
SHARDS, a key whose message sits on an older layout's shard is found, kept, replaced,
rescheduled and cancelled there (engine.sharding.store's docstring: a key's home)."""

import json
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import KeyedSent, NewMessage
from delayqueue_django.engine.sharding import layouts as shard_layouts
from delayqueue_django.engine.sharding.placement import (
    key_shard,
    place,
    shard_name,
    shard_of,
    with_shard,
)
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from delayqueue_django.exceptions import DuplicateKey
from tests.backends import SHARDED_BACKENDS
from tests.conftest import MEMORY_URL
from tests.redis_servers import RedisClusterServers

MINUTE_US = 60_000_000
KEYS = [f"order-{n}" for n in range(40)]

# The contract's tests on sharded backends: SHARDS 4 in memory, 6 on the 3-master Cluster.
sharded_backends = pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)


def keyed(
    message_id: str, key: str, payload: Any = "x", *, if_exists: str = "keep", **timing: Any
) -> NewMessage:
    timing.setdefault("delay_us", MINUTE_US)
    return NewMessage(message_id, json.dumps(payload), 3, key=key, if_exists=if_exists, **timing)


def new_ids(count: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(count)]


def send_keyed(
    store: ShardedStore,
    keys: Sequence[str],
    payload: Any = "x",
    *,
    if_exists: str = "keep",
    **timing: Any,
) -> list[KeyedSent]:
    """One send_keyed of a message per key, each id placed by its key (as Queue places)."""
    ids = store.place(new_ids(len(keys)), list(keys))
    return store.send_keyed(
        [
            keyed(message_id, key, payload, if_exists=if_exists, **timing)
            for message_id, key in zip(ids, keys, strict=True)
        ]
    )


def home_of(key: str, layout: int) -> str:
    """The name of the key's shard of ``layout``."""
    return shard_name(layout, key_shard(key, layout))


def named_shard(message_id: str) -> str:
    return shard_name(*shard_of(message_id))


def sharded(queue: Queue) -> ShardedStore:
    assert isinstance(queue.store, ShardedStore), queue.store
    return queue.store


# Placing by key


def test_a_keys_shard_is_the_crc32_of_its_utf8_bytes_modulo_the_layout() -> None:
    for key in ("order-42", "ключ", "🔑 " * 60, "~4.2"):
        for layout in (1, 2, 6, 128):
            assert key_shard(key, layout) == zlib.crc32(key.encode()) % layout
    assert key_shard("order-42", 8) == 6  # fixed forever: stored messages depend on it


def test_place_gives_keyed_ids_their_keys_shard_and_the_others_a_random_one() -> None:
    ids = [f"id{n}" for n in range(400)]
    keys: list[str | None] = [f"order-{n % 7}" if n % 2 else None for n in range(400)]

    placed = place(ids, 8, keys)

    for message_id, key, result in zip(ids, keys, placed, strict=True):
        assert result.startswith(message_id)
        if key is not None:
            assert named_shard(result) == home_of(key, 8)
    unkeyed = Counter(
        named_shard(result) for result, key in zip(placed, keys, strict=True) if key is None
    )
    assert len(unkeyed) == 8  # 200 ids at random: every shard, all but surely
    with pytest.raises(ValueError, match="shorter"):
        place(ids, 8, keys[:-1])


def test_with_shard_replaces_the_shard_an_id_names() -> None:
    assert with_shard("AbCd~4.2", 8, 5) == "AbCd~8.5"
    assert with_shard("AbCd~4.2", 1, 0) == "AbCd"
    assert with_shard("AbCd", 4, 3) == "AbCd~4.3"
    # A suffix that names no shard is part of the id.
    assert with_shard("AbCd~200.3", 4, 1) == "AbCd~200.3~4.1"


# One layout: a key is its shard's


@sharded_backends
def test_the_same_key_always_lands_on_its_keys_shard(queue: Queue) -> None:
    store = sharded(queue)
    created = send_keyed(store, KEYS)
    # Again, with ids placed at random: each is moved to its key's shard, which decides.
    again = store.send_keyed(
        [
            keyed(message_id, key, "new", if_exists="replace")
            for message_id, key in zip(store.place(new_ids(len(KEYS))), KEYS, strict=True)
        ]
    )

    assert [sent.outcome for sent in created] == ["created"] * len(KEYS)
    assert len({named_shard(sent.id) for sent in created}) > 2  # the keys spread
    shards = parts(store)
    for key, sent, replaced in zip(KEYS, created, again, strict=True):
        assert named_shard(sent.id) == home_of(key, store.layout)
        assert (replaced.id, replaced.outcome) == (sent.id, "replaced")
        holding = [name for name, shard in shards.items() if shard.lookup(key) is not None]
        assert holding == [home_of(key, store.layout)]
    assert queue.stats()["pending"] == len(KEYS)


@sharded_backends
def test_keep_replace_and_error_across_keys_spread_over_the_shards(queue: Queue) -> None:
    store = sharded(queue)
    created = send_keyed(store, KEYS, "first")
    ids = [sent.id for sent in created]

    kept = send_keyed(store, KEYS, "second")
    assert [(sent.id, sent.outcome) for sent in kept] == [(i, "kept") for i in ids]
    assert {json.loads(str(queue.peek(i).payload)) for i in ids} == {"first"}  # type: ignore[union-attr]

    replaced = send_keyed(store, KEYS, "third", if_exists="replace")
    assert [(sent.id, sent.outcome) for sent in replaced] == [(i, "replaced") for i in ids]
    assert {json.loads(str(queue.peek(i).payload)) for i in ids} == {"third"}  # type: ignore[union-attr]

    for key, message_id in zip(KEYS[:5], ids, strict=False):
        with pytest.raises(DuplicateKey) as refused:
            send_keyed(store, [key], "fourth", if_exists="error")
        assert (refused.value.key, refused.value.message_id) == (key, message_id)
    assert queue.stats()["pending"] == len(KEYS)


@sharded_backends
def test_a_refusal_leaves_a_batch_spread_over_shards_unwritten(queue: Queue) -> None:
    """Its "error" messages all on one shard: that shard is asked first, and refuses."""
    store = sharded(queue)
    (waiting,) = send_keyed(store, KEYS[:1])
    others = KEYS[1:]
    ids = store.place(new_ids(len(others) + 1), [*others, KEYS[0]])
    batch = [keyed(message_id, key) for message_id, key in zip(ids, others, strict=False)]

    with pytest.raises(DuplicateKey) as refused:
        store.send_keyed([*batch, keyed(ids[-1], KEYS[0], if_exists="error")])

    assert refused.value.message_id == waiting.id
    assert len({named_shard(message.id) for message in batch}) > 2
    assert queue.stats()["pending"] == 1
    assert [key for key in others if store.lookup(key) is not None] == []


@sharded_backends
def test_two_items_with_one_key_in_a_batch_are_decided_in_order_on_its_shard(
    queue: Queue,
) -> None:
    store = sharded(queue)
    first, second, third = send_keyed(store, ["k", "k", "other"], "x")
    assert first.outcome == "created"
    assert (second.id, second.outcome) == (first.id, "kept")
    assert third.outcome == "created"


@sharded_backends
def test_lookup_cancel_and_reschedule_by_key_go_to_the_keys_shard(queue: Queue) -> None:
    store = sharded(queue)
    ids = [sent.id for sent in send_keyed(store, KEYS)]

    for key, message_id in zip(KEYS, ids, strict=True):
        found = store.lookup(key)
        assert found is not None
        assert (found.id, found.key, found.state) == (message_id, key, "pending")
    assert store.lookup("never-sent") is None

    due = store.reschedule(key=KEYS[0], delay_us=5 * MINUTE_US)
    assert due is not None
    assert queue.peek(ids[0]).score_ms == due  # type: ignore[union-attr]
    by_id = store.reschedule(message_id=ids[1], delay_us=7 * MINUTE_US)
    assert by_id is not None
    assert queue.peek(ids[1]).score_ms == by_id  # type: ignore[union-attr]
    assert store.reschedule(key="never-sent", delay_us=0) is None

    assert store.cancel_key(KEYS[2]) == ids[2]
    assert store.cancel_key(KEYS[2]) is None
    assert store.lookup(KEYS[2]) is None
    assert queue.stats()["pending"] == len(KEYS) - 1


@sharded_backends
def test_reschedule_takes_an_id_or_a_key(queue: Queue) -> None:
    store = sharded(queue)
    with pytest.raises(ValueError, match="message_id or a key"):
        store.reschedule(delay_us=0)
    with pytest.raises(ValueError, match="not both"):
        store.reschedule(message_id="a", key="a", delay_us=0)


@sharded_backends
def test_a_keyed_send_in_a_steady_layout_asks_no_other_shard(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sharded(queue)
    asked: list[str] = []
    for name, shard in parts(store).items():
        monkeypatch.setattr(shard, "lookup", lambda key, name=name: asked.append(name))
        monkeypatch.setattr(shard, "holds_key", lambda key, name=name: asked.append(name))

    send_keyed(store, KEYS)

    assert asked == []


# Through a reshard


@pytest.fixture
def fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each store reads the register at every look: these tests change it between calls."""
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 0.0)


@pytest.fixture(params=["memory", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return MEMORY_URL
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    cluster.flush()
    return cluster.url


def with_shards(settings: Any, url: str, shards: int) -> ShardedStore:
    """The default queue's store with ``shards`` (a process of that SHARDS); stores made
    before stay as they are (processes still on their SHARDS)."""
    settings.DELAYQUEUES = {
        "default": {"URL": url, "SHARDS": shards, "RETRY_COUNT": 2, "NACK_REDELIVERY_DELAY": 0}
    }
    store = sharded(get_queue())
    assert store.layout == shards
    return store


# A key whose shards of layouts 4 and 8 are not shard 0, which every layout shares.
KEY = next(key for key in KEYS if key_shard(key, 4) and key_shard(key, 8))


@pytest.mark.usefixtures("fresh_layouts")
def test_a_key_waiting_on_an_older_layout_is_kept_replaced_and_found_there(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    (first,) = send_keyed(old, [KEY], "first")
    assert named_shard(first.id) == home_of(KEY, 4)

    new = with_shards(settings, url, 8)
    (kept,) = send_keyed(new, [KEY], "second")
    (replaced,) = send_keyed(new, [KEY], "third", if_exists="replace")
    with pytest.raises(DuplicateKey) as refused:
        send_keyed(new, [KEY], "fourth", if_exists="error")
    found = new.lookup(KEY)

    assert (kept.id, kept.outcome) == (first.id, "kept")
    assert (replaced.id, replaced.outcome) == (first.id, "replaced")
    assert refused.value.message_id == first.id
    assert found is not None
    assert (found.id, json.loads(str(found.payload))) == (first.id, "third")
    assert new.stats()["pending"] == 1
    assert new.lookup("never-sent") is None


@pytest.mark.usefixtures("fresh_layouts")
def test_a_key_waiting_on_an_older_layout_is_rescheduled_and_cancelled_there(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    (first,) = send_keyed(old, [KEY])
    new = with_shards(settings, url, 8)

    due = new.reschedule(key=KEY, delay_us=9 * MINUTE_US)
    assert due is not None
    assert new.peek(first.id).score_ms == due  # type: ignore[union-attr]
    assert new.cancel_key(KEY) == first.id
    assert new.lookup(KEY) is None

    # The key is free: its next message goes to its shard of the new layout.
    (created,) = send_keyed(new, [KEY])
    assert created.outcome == "created"
    assert named_shard(created.id) == home_of(KEY, 8)
    assert new.lookup(KEY).id == created.id  # type: ignore[union-attr]


@pytest.mark.usefixtures("fresh_layouts")
def test_a_sender_still_on_the_older_layout_finds_the_key_on_the_new_one(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    new = with_shards(settings, url, 8)
    (first,) = send_keyed(new, [KEY])

    (kept,) = send_keyed(old, [KEY])
    found = old.lookup(KEY)

    assert named_shard(first.id) == home_of(KEY, 8)
    assert (kept.id, kept.outcome) == (first.id, "kept")
    assert found is not None
    assert found.id == first.id
    assert old.cancel_key(KEY) == first.id


@pytest.mark.usefixtures("fresh_layouts")
def test_a_key_in_flight_on_an_older_layout_gets_its_next_message_there(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    (first,) = send_keyed(old, [KEY], "first", delay_us=0)
    new = with_shards(settings, url, 8)
    queue = get_queue()  # the new layout's: it drains the older one's shards
    (delivery,) = queue.fetch(10).messages
    assert delivery.id == first.id

    (second,) = send_keyed(new, [KEY], "second")
    (outcome,) = queue.nack([delivery])

    # The new message went where the key's message was, which it supersedes there: one
    # waiting message for the key, on one shard.
    assert second.outcome == "created"
    assert named_shard(second.id) == home_of(KEY, 4)
    assert outcome.superseded
    assert new.lookup(KEY).id == second.id  # type: ignore[union-attr]
    assert new.stats()["pending"] == 1


@pytest.mark.usefixtures("fresh_layouts")
def test_cancel_by_key_leaves_no_waiting_message_of_the_key_on_any_layout(
    settings: Any, url: str
) -> None:
    """Two senders racing through a reshard can each create a message for a key (the rule
    is not atomic across shards): a cancel removes both."""
    new = with_shards(settings, url, 8)
    (on_new,) = send_keyed(new, [KEY])
    # The other sender, of layout 4, found nothing on layout 8's shard a moment before.
    new.base.add_layout(4)
    shards = parts(new)
    on_old = shards[home_of(KEY, 4)].send_keyed(
        [keyed(with_shard("raced", 4, key_shard(KEY, 4)), KEY)]
    )

    assert (on_new.outcome, on_old[0].outcome) == ("created", "created")
    assert new.stats()["pending"] == 2
    assert new.cancel_key(KEY) is not None
    assert new.stats()["pending"] == 0
    assert new.lookup(KEY) is None
