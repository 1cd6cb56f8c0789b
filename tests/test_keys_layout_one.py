"""Keys through a change of SHARDS from or to 1 (issue #33): layout 1 on the register, so that
a key sent while the queue had one shard is found on shard 0 by every layout after it (and a
key sent under more shards by a process still on one); ``unique_for`` windows across any
change of SHARDS; and retiring a layout that keyed messages on shard 0 still need.

The keys guide's promise is checked both ways: a key is found from the new layout, and from
every older one still running."""

import asyncio
import json
import time
from collections import Counter
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.sharding import layouts as shard_layouts
from delayqueue_django.engine.sharding.placement import SHARD_MARK, key_shard, shard_name, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from tests.conftest import MEMORY_URL
from tests.redis_servers import RedisClusterServers, RedisServer

KEYS = [f"order-{n}" for n in range(30)]
# The keys that a layout of 3 puts on a shard other than shard 0: 17 of the 30.
OFF_SHARD_0 = [key for key in KEYS if key_shard(key, 3)]


@pytest.fixture(params=["memory", "redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return MEMORY_URL
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.client().flushall()
        return server.url
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    cluster.flush()
    return cluster.url


@pytest.fixture(autouse=True)
def fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each store reads the register at every look: these tests change it between calls."""
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 0.0)


def with_shards(settings: Any, url: str, shards: int) -> Queue:
    """The default queue with ``shards`` (a process of that SHARDS); queues made before keep
    theirs (processes still on their SHARDS)."""
    settings.DELAYQUEUES = {
        "default": {"URL": url, "SHARDS": shards, "RETRY_COUNT": 2, "NACK_REDELIVERY_DELAY": 0}
    }
    queue = get_queue()
    assert isinstance(queue.store, ShardedStore)
    assert queue.store.layout == shards
    return queue


def sharded(queue: Queue) -> ShardedStore:
    assert isinstance(queue.store, ShardedStore)
    return queue.store


def payload_of(queue: Queue, message_id: str) -> Any:
    found = queue.peek(message_id)
    assert found is not None, message_id
    return json.loads(str(found.payload))


def handle_all(queue: Queue, expected: int) -> Counter[str]:
    """Fetch and ack until ``expected`` deliveries came (or 10 s passed)."""
    handled: Counter[str] = Counter()
    deadline = time.monotonic() + 10
    while sum(handled.values()) < expected and time.monotonic() < deadline:
        fetched = queue.fetch(50)
        queue.ack(fetched.messages)
        handled.update(message.id for message in fetched.messages)
        if not fetched.messages:
            time.sleep(0.01)
    return handled


def test_keys_sent_under_one_shard_are_found_kept_replaced_rescheduled_and_cancelled_on_three(
    settings: Any, url: str
) -> None:
    """Issue #33: with SHARDS 1 then 3, lookup answered None for 20 keys of 30, and keep,
    replace, reschedule and cancel missed them, making second messages."""
    assert len(OFF_SHARD_0) == 17
    old = with_shards(settings, url, 1)
    ids = {key: old.send({"v": "first"}, key=key, delay=60) for key in KEYS}
    assert not any(SHARD_MARK in message_id for message_id in ids.values())  # all on shard 0

    new = with_shards(settings, url, 3)
    # Before the new layout wrote anything (its register still empty)...
    assert {key: getattr(new.lookup(key), "id", None) for key in KEYS} == ids
    # ...and after (its registration brings layout 1 along).
    new.send_many([{"n": n} for n in range(20)], delay=60)
    assert sharded(new).base.layouts() == {1, 3}
    assert {key: getattr(new.lookup(key), "id", None) for key in KEYS} == ids

    kept, replaced = OFF_SHARD_0[:5], OFF_SHARD_0[5:10]
    rescheduled, cancelled = OFF_SHARD_0[10:13], OFF_SHARD_0[13:]
    for key in kept:
        assert new.send({"v": "second"}, key=key, delay=60) == ids[key]
    for key in replaced:
        assert new.send({"v": "third"}, key=key, if_exists="replace", delay=60) == ids[key]
    for key in rescheduled:
        before = new.peek(ids[key]).score_ms  # type: ignore[union-attr]
        assert new.reschedule(key=key, delay=600)
        assert new.peek(ids[key]).score_ms > before  # type: ignore[union-attr,operator]
    for key in cancelled:
        assert new.cancel(key=key)
        assert new.lookup(key) is None

    # One message per key still waiting, each where it was sent, with the payload it should.
    assert new.stats()["pending"] == 20 + len(KEYS) - len(cancelled)
    assert {payload_of(new, ids[key])["v"] for key in kept} == {"first"}
    assert {payload_of(new, ids[key])["v"] for key in replaced} == {"third"}
    # And from the older layout, still running: the same messages.
    for key in kept + replaced:
        assert old.send({"v": "fourth"}, key=key, delay=60) == ids[key]
        assert old.lookup(key).id == ids[key]  # type: ignore[union-attr]
    assert old.stats()["pending"] == 20 + len(KEYS) - len(cancelled)


def test_senders_on_one_shard_and_on_three_find_each_others_keys(settings: Any, url: str) -> None:
    """A process still on SHARDS 1 sends keys after layout 3 is registered (the queue had
    none before, so layout 3's registration did not bring layout 1): its send registers
    layout 1, and the processes of 3 find its keys; it finds theirs."""
    old = with_shards(settings, url, 1)
    new = with_shards(settings, url, 3)
    new.send_many([{"n": n} for n in range(20)], delay=60)
    assert sharded(new).base.layouts() == {3}

    on_old = {key: old.send("old", key=key, delay=60) for key in OFF_SHARD_0[:10]}
    on_new = {key: new.send("new", key=key, delay=60) for key in OFF_SHARD_0[10:]}

    assert sharded(new).base.layouts() == {1, 3}
    for key, message_id in on_old.items():
        assert new.lookup(key).id == message_id  # type: ignore[union-attr]
        assert new.send("again", key=key, delay=60) == message_id
    for key, message_id in on_new.items():
        assert shard_of(message_id) == (3, key_shard(key, 3))
        assert old.lookup(key).id == message_id  # type: ignore[union-attr]
        assert old.send("again", key=key, delay=60) == message_id
    assert new.stats()["pending"] == 20 + len(OFF_SHARD_0)


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 1), (3, 6)])
def test_a_unique_for_window_holds_across_a_change_of_shards(
    settings: Any, url: str, before: int, after: int
) -> None:
    """Issue #33: 34 keys of 40 ran twice when their unique_for window crossed a change of
    SHARDS. The message is handled, its hold lasts: a send of the key under the new layout
    (or the old one, still running) is held, and answers the holder's id."""
    old = with_shards(settings, url, before)
    ids = {key: old.send("first", key=key, unique_for=60) for key in KEYS}
    assert handle_all(old, len(KEYS)) == Counter(ids.values())
    new = with_shards(settings, url, after)
    new.send_many([{"n": n} for n in range(20)], delay=60)  # the new layout registered

    assert {key: new.send("second", key=key, unique_for=60) for key in KEYS} == ids
    assert {key: old.send("third", key=key, unique_for=60) for key in KEYS} == ids
    assert new.stats()["pending"] == 20


def test_layout_1_is_retired_once_shard_0_holds_no_key_only_it_finds(
    settings: Any, url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = with_shards(settings, url, 1)
    ids = {key: old.send("x", key=key, delay=60) for key in KEYS}
    new = with_shards(settings, url, 3)
    new.send_many([{"n": n} for n in range(20)], delay=60)

    # (What the command shows as draining is the register as read within the recheck.)
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 10.0)
    call_command("delayqueue_shards", "default")
    assert capsys.readouterr().out.splitlines()[0] == (
        "queue default: SHARDS 3 (live); draining: 1"
    )
    stranded = rf"layout 1 still holds messages \(0: {len(OFF_SHARD_0)} keyed\)"
    with pytest.raises(CommandError, match=stranded):
        call_command("delayqueue_shards", "default", "--retire", "1")
    for key in OFF_SHARD_0:
        assert new.cancel(key=key)
    call_command("delayqueue_shards", "default", "--retire", "1")

    assert sharded(new).base.layouts() == {3}
    # The keys whose shard of 3 is shard 0 are still found there.
    for key in set(KEYS) - set(OFF_SHARD_0):
        assert new.lookup(key).id == ids[key]  # type: ignore[union-attr]


def test_a_layout_is_retired_once_shard_0_holds_no_key_only_it_finds(
    settings: Any, url: str
) -> None:
    """Shard 0 is every layout's: layout 4's messages there were not counted, so retiring 4
    left a key whose shard of 4 is shard 0, but not of 8, to no one's lookup."""
    key = next(key for key in KEYS if key_shard(key, 4) == 0 and key_shard(key, 8))
    old = with_shards(settings, url, 4)
    plain = old.send_many([{"n": n} for n in range(20)])
    sent = old.send("x", key=key, delay=60)
    assert shard_name(*shard_of(sent)) == "0"
    new = with_shards(settings, url, 8)
    assert handle_all(new, len(plain)) == Counter(plain)  # layout 4's other shards empty

    with pytest.raises(CommandError, match=r"layout 4 still holds messages \(0: 1 keyed\)"):
        call_command("delayqueue_shards", "default", "--retire", "4")
    assert new.lookup(key).id == sent  # type: ignore[union-attr]
    assert new.cancel(key=key)
    call_command("delayqueue_shards", "default", "--retire", "4")
    assert 4 not in sharded(new).base.layouts()


def test_a_relayed_row_placed_under_one_shard_registers_layout_1(settings: Any, url: str) -> None:
    """An outbox row of a process of one shard names shard 0; a worker of 3 relays it there,
    and registers layout 1 so that its key is found."""
    key = OFF_SHARD_0[0]
    relay = with_shards(settings, url, 3)

    sharded(relay).relay(
        [NewMessage("relayed-row", '"x"', 0, at_ms=int(time.time() * 1000) + 60_000, key=key)],
        forget=[],
        keep_ms=60_000,
    )

    assert sharded(relay).base.layouts() == {1, 3}
    assert relay.lookup(key).id == "relayed-row"  # type: ignore[union-attr]
    assert relay.send("again", key=key) == "relayed-row"


@pytest.mark.parametrize("shards", [1, 3])
def test_a_queue_that_never_changed_shards_pays_nothing_more_for_keys(
    settings: Any, url: str, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No layout 1 on the register (whose lookups every keyed call would pay), and no
    other shard asked by a keyed send: on one shard, no register written at all; on 3,
    its layout only, even when its first writes went to shard 0."""
    queue = with_shards(settings, url, shards)
    at_0 = [key for key in KEYS if key_shard(key, shards) == 0]
    for key in at_0:
        queue.send("x", key=key, unique_for=60)
    store = sharded(queue)
    asked: list[str] = []
    for name, shard in parts(store).items():
        monkeypatch.setattr(shard, "holds_key", lambda key, name=name: asked.append(name))
        monkeypatch.setattr(shard, "lookup", lambda key, name=name: asked.append(name))

    for key in KEYS:
        queue.send("y", key=key)
    queue.send_many([{"n": n} for n in range(20)])

    assert asked == []
    assert store.base.layouts() == (set() if shards == 1 else {shards})


def test_async_keyed_calls_of_one_shard_find_a_key_on_an_earlier_layout(
    settings: Any, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asend, areschedule and acancel of a queue of one shard went to shard 0 alone, even
    while an earlier layout's shard held the key's message (a second message was made)."""
    redis_server.client().flushall()
    key = OFF_SHARD_0[0]
    old = with_shards(settings, redis_server.url, 3)
    waiting = old.send("first", key=key, delay=60)
    queue = with_shards(settings, redis_server.url, 1)
    # As a worker or a sync call did lately: the async calls then know what it drains.
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 10.0)
    sharded(queue).refresh_layouts(force=True)
    assert sharded(queue).draining() == (3,)

    async def scenario() -> tuple[str, bool, bool]:
        sent = await queue.asend("second", key=key, delay=60)
        rescheduled = await queue.areschedule(key=key, delay=600)
        cancelled = await queue.acancel(key=key)
        return sent, rescheduled, cancelled

    assert asyncio.run(scenario()) == (waiting, True, True)
    assert queue.stats()["pending"] == 0
