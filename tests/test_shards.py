"""A queue spread over shards (``SHARDS``, engine.sharding: placement and store): ids that
name their shard, tags whose slots fall evenly over a cluster's masters, the Queue API and
the worker across shards on Redis Cluster, one call per shard touched, fetches that take
turns and ask only the shards due, a master that stops answering, and the invariant
checker's ``wrong-shard``."""

import itertools
import json
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

import delayqueue_django
from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES, FetchResult, NewMessage
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.sharding import fetch as shard_fetch
from delayqueue_django.engine.sharding.layouts import SHARD_RETRY_SECONDS
from delayqueue_django.engine.sharding.placement import (
    MAX_SHARDS,
    parse_name,
    shard_keys,
    shard_name,
    shard_of,
    shard_suffix,
    slot_of,
)
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.exceptions import QueueUnavailable
from delayqueue_django.worker import Worker
from tests.helpers import fetch_when_due, wait_for
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.test_worker_processes import WorkerProcess, events, spawn
from tests.worker_handlers import handle, read_log

# What the contract tests run on a sharded queue (tests/backends.py) is not repeated here:
# these are the tests of what only a sharded queue does.


def sharded_queue(settings: Any, url: str, shards: int, **options: Any) -> Queue:
    """The default queue, on ``url`` over ``shards`` shards."""
    settings.DELAYQUEUES = {"default": {"URL": url, "SHARDS": shards, **options}}
    queue = get_queue()
    sharded(queue)
    return queue


def sharded(queue: Queue) -> ShardedStore:
    assert isinstance(queue.store, ShardedStore), queue.store
    return queue.store


def new_message(message_id: str, payload: Any = "x", **timing: Any) -> NewMessage:
    """A message for a store's own send: the id as given (and the shard it names)."""
    return NewMessage(message_id, json.dumps(payload), 3, **timing)


def shard_of_id(message_id: str) -> str:
    """The name of the shard an id names."""
    return shard_name(*shard_of(message_id))


# Ids and names


@pytest.mark.parametrize(
    ("message_id", "shard"),
    [
        ("AbCdEfGhIjKlMn", (1, 0)),  # an unsharded queue's id
        ("tick:nightly:1700000000000", (1, 0)),  # schedule ticks live on shard 0
        ("tick:a~4.2:1700000000000", (1, 0)),  # ...whatever their schedule is called
        ("AbCd~4.2", (4, 2)),
        ("~4.2", (4, 2)),
        ("AbCd~4.1", (4, 1)),
        ("AbCd~128.127", (128, 127)),
        ("AbCd~2.1", (2, 1)),
        ("AbCd~4.4", (1, 0)),  # no shard 4 in a layout of 4
        ("AbCd~4.7", (1, 0)),
        ("AbCd~1.0", (1, 0)),  # shard 0 has no suffix
        ("AbCd~4.0", (1, 0)),
        ("AbCd~0.0", (1, 0)),
        ("AbCd~129.1", (1, 0)),  # more than MAX_SHARDS
        ("AbCd~1000.1", (1, 0)),
        ("AbCd~04.2", (1, 0)),  # leading zeros: not a suffix shard_suffix writes
        ("AbCd~4.02", (1, 0)),
        ("AbCd~4.2x", (1, 0)),  # trailing junk
        ("AbCd~4.2~", (1, 0)),
        ("AbCd~4.2\n", (1, 0)),  # (a "$" would match before a final newline)
        ("AbCd~4.2.1", (1, 0)),
        ("AbCd~4", (1, 0)),
        ("AbCd~.2", (1, 0)),
        ("AbCd-4.2", (1, 0)),
        ("AbCd~+4.2", (1, 0)),
        ("AbCd~\uff14.2", (1, 0)),  # a fullwidth digit 4
        ("AbCd~\u0664.2", (1, 0)),  # an Arabic-Indic digit 4
        ("AbCd~3.1~4.2", (4, 2)),  # the last suffix counts
        ("AbCd~4.2junk~3.1", (3, 1)),
    ],
)
def test_shard_of_reads_only_a_well_formed_suffix_of_a_real_shard(
    message_id: str, shard: tuple[int, int]
) -> None:
    assert shard_of(message_id) == shard


def test_suffixes_and_names_round_trip_for_every_shard_of_every_layout() -> None:
    for layout in range(1, MAX_SHARDS + 1):
        for index in range(layout):
            named = (layout, index) if index else (1, 0)
            suffix = shard_suffix(layout, index)
            assert shard_of("AbCdEfGhIjKlMn" + suffix) == named, (layout, index)
            assert parse_name(shard_name(layout, index)) == named, (layout, index)
            assert shard_name(*shard_of("x" + suffix)) == shard_name(layout, index)
    assert shard_suffix(4, 0) == shard_suffix(1, 0) == ""
    assert (shard_name(4, 0), shard_name(4, 3), shard_suffix(4, 3)) == ("0", "4.3", "~4.3")


@pytest.mark.parametrize(
    "name",
    ["", "1", "4", "1.0", "4.0", "4.4", "4.9", "0.0", "129.1", "129.128", "4.", ".2", "x",
     "4.x", "4.2.1", "-4.2", "4.-2", " 4.2", "4.2 ", "+4.2", "\uff14.2", "4\u00b2.1", "4,2"],
)  # fmt: skip
def test_parse_name_refuses_what_names_no_shard(name: str) -> None:
    with pytest.raises(ValueError, match=r"is not a shard's name \(0, or <layout>\.<index>\)"):
        parse_name(name)


# Where the shards' keys live


def even_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots each master of a new cluster owns, as ``redis-cli --cluster create`` splits
    them (each range ends where the next starts, rounded to the nearest slot): for 3,
    0-5460, 5461-10922, 10923-16383."""
    ring = REDIS_CLUSTER_HASH_SLOTS
    starts = [round(i * ring / masters) for i in range(masters)] + [ring]
    return [(starts[i], starts[i + 1] - 1) for i in range(masters)]


def per_range(slots: list[int], ranges: list[tuple[int, int]]) -> list[int]:
    return [sum(first <= slot <= last for slot in slots) for first, last in ranges]


def shard_slots(prefix: str, queue: str, layout: int) -> list[int]:
    base = QueueKeys(prefix, queue)
    return [slot_of(shard_keys(base, layout, index)) for index in range(layout)]


# A few hundred names: one in about 40 put a shard over a master's edge when a shard's
# slot was chosen a few slots after a point k/N of the ring from shard 0's (with 12 shards,
# a master held 5, another 3; "q235"'s 3 shards left a master none).
QUEUE_NAMES = [("delayqueue", "default"), ("delayqueue", "q235"), ("shop", "orders")] + [
    (prefix, f"q{n}") for prefix in ("delayqueue", "p") for n in range(150)
]


@pytest.mark.parametrize(
    ("layout", "masters", "names"),
    # (128 shards cost some 65,000 CRC16 sums a queue name: a few names.)
    [(12, 3, 303), (3, 3, 303), (6, 3, 303), (8, 2, 303), (128, 4, 4), (128, 8, 4)],
)
def test_the_shards_fall_evenly_over_masters_that_split_the_slots_evenly(
    layout: int, masters: int, names: int
) -> None:
    ranges = even_ranges(masters)
    for prefix, queue in QUEUE_NAMES[:names]:
        slots = shard_slots(prefix, queue, layout)
        assert slots[0] == slot_of(QueueKeys(prefix, queue))  # shard 0 is the queue's own
        assert len(set(slots)) == layout
        assert per_range(slots, ranges) == [layout // masters] * masters, (prefix, queue)


def test_a_shards_tag_never_changes() -> None:
    """Tags are the keys' names: a release that moved them would strand every message."""
    base = QueueKeys("delayqueue", "default")
    assert shard_keys(base, 1, 0) == shard_keys(base, 4, 0) == base
    assert [
        (shard_keys(base, 4, index).tag, slot_of(shard_keys(base, 4, index))) for index in range(4)
    ] == [
        ("{delayqueue:default}", 4541),
        ("{delayqueue:default~4.1.771}", 10250),
        ("{delayqueue:default~4.2.212}", 14317),
        ("{delayqueue:default~4.3.275}", 2045),
    ]


# The Queue API and the worker on a cluster


def masters_of(cluster: RedisClusterServers) -> list[tuple[RedisServer, int, int]]:
    """The cluster's masters with the slots each serves, as the cluster itself says."""
    client = cluster.nodes[0].client(socket_timeout=5)
    try:
        ranges = client.cluster("slots")
    finally:
        client.close()
    masters = [
        (next(node for node in cluster.nodes if node.port == port), first, last)
        for first, last, (_, port, *_) in (entry[:3] for entry in ranges)
    ]
    return sorted(masters, key=lambda master: master[1])


def tags_held(node: RedisServer, queue: Queue) -> set[str]:
    """The hash tags of the queue's keys a node holds (its shards there)."""
    client = node.client(socket_timeout=5)
    try:
        keys = client.scan_iter(match=f"{{{queue.store.keys.prefix}:{queue.name}*", count=1000)
        return {key.decode().partition("}")[0] + "}" for key in keys}
    finally:
        client.close()


@pytest.mark.cluster
def test_a_queue_of_12_shards_spreads_over_every_master_and_works_across_them(
    redis_cluster: RedisClusterServers, settings: Any
) -> None:
    redis_cluster.flush()
    options = {"HANDLER": "tests.worker_handlers.handle", "NACK_REDELIVERY_DELAY": 0}
    queue = sharded_queue(settings, redis_cluster.url, 12, RETRY_COUNT=1, **options)
    store = sharded(queue)
    masters = masters_of(redis_cluster)
    assert len(masters) == 3
    # Four shards a master, as the cluster itself serves their slots.
    owned = {
        node.port: {
            shard.keys.tag
            for shard in store.shards.values()
            if first <= slot_of(shard.keys) <= last
        }
        for node, first, last in masters
    }
    assert sorted(len(tags) for tags in owned.values()) == [4, 4, 4]

    ok = queue.send_many([{"n": n} for n in range(40)])
    failing = queue.send_many([{"do": "raise", "n": n} for n in range(12)])
    later = [delayqueue_django.send({"n": n}, delay=3600) for n in range(8)]
    every = ok + failing + later
    assert len(set(every)) == 60
    assert {shard_of_id(message_id) for message_id in every} <= set(store.shards)
    assert len({shard_of_id(message_id) for message_id in every}) >= 6  # (60 at random over 12)
    for node, _, _ in masters:
        held = tags_held(node, queue)
        assert held, f"no shard's keys on master {node.port}"
        assert held <= owned[node.port]
    # Each message is found where its id says, whatever the shard.
    for n, message_id in enumerate(ok):
        stored = queue.peek(message_id)
        assert stored is not None
        assert (stored.state, json.loads(stored.payload or "")) == ("pending", {"n": n})

    cancelled, kept = later[:4], later[4:]
    assert [delayqueue_django.cancel(message_id) for message_id in cancelled] == [True] * 4
    assert [delayqueue_django.cancel(message_id) for message_id in cancelled] == [False] * 4
    assert [queue.peek(message_id) for message_id in cancelled] == [None] * 4

    worker = Worker([(queue, handle)], heartbeat_interval=0.2, burst=True)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive()

    log = read_log()
    done = Counter(entry["id"] for entry in log if entry["event"] == "done")
    assert done == Counter(ok)
    # Each failing message tried twice (one retry), then buried and announced once.
    attempts = Counter(
        (entry["id"], entry["attempt"]) for entry in log if entry["event"] == "start"
    )
    assert {key for key in attempts if key[0] in failing} == {
        (message_id, attempt) for message_id in failing for attempt in (1, 2)
    }
    assert max(attempts.values()) == 1
    exhausted = Counter(entry["id"] for entry in log if entry["event"] == "exhausted")
    assert exhausted == Counter(failing)
    garbage = queue.list_messages("garbage", limit=100)
    assert sorted(entry.id for entry in garbage) == sorted(failing)
    stats = queue.stats()
    assert (stats["garbage"], stats["unannounced"], stats["pending"]) == (12, 0, 4)
    assert (stats["ready"], stats["retry"], stats["unack"]) == (0, 0, 0)

    # Dead letters of several shards requeued in one call, the rest purged.
    back, dropped = failing[:6], failing[6:]
    assert sorted(queue.requeue(back)) == sorted(back)
    assert queue.purge_garbage() == 6
    assert [queue.peek(message_id) for message_id in dropped] == [None] * 6
    fetched = fetch_when_due(queue, count=20)
    assert sorted(message.id for message in fetched) == sorted(back)
    # One nack over several shards: the outcomes in the order asked, each a retry.
    outcomes = queue.nack(fetched)
    assert [outcome.id for outcome in outcomes] == [message.id for message in fetched]
    assert not any(outcome.exhausted for outcome in outcomes)
    again = fetch_when_due(queue, count=20)
    assert sorted(message.id for message in again) == sorted(back)
    assert queue.ack(again) == set(back)

    assert sorted(queue.deliver_now(kept)) == sorted(kept)
    last = fetch_when_due(queue, count=20)
    assert sorted(message.id for message in last) == sorted(kept)
    assert queue.ack(last) == set(kept)
    stats = queue.stats()
    assert sum(stats[state] for state in STATES) == 0
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert report.messages == 0


# Round trips


def function_calls(server: RedisServer) -> int:
    """FCALL and FCALL_RO calls the server ran since its stats were reset."""
    client = server.client()
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(
        stats.get(name, {}).get("calls", 0) for name in ("cmdstat_fcall", "cmdstat_fcall_ro")
    )


def reset_stats(server: RedisServer) -> None:
    client = server.client()
    try:
        client.config_resetstat()
    finally:
        client.close()


def test_a_cancel_is_one_call_and_a_send_one_call_per_shard_it_touches(
    redis_server: RedisServer, settings: Any
) -> None:
    queue = sharded_queue(settings, redis_server.url, 4)
    waiting = queue.send_many([{"n": n} for n in range(40)], delay=3600)  # (loads the library)
    one_a_shard = {shard_of_id(message_id): message_id for message_id in waiting}

    for name, message_id in one_a_shard.items():
        reset_stats(redis_server)
        assert queue.cancel(message_id)
        assert function_calls(redis_server) == 1, name
    reset_stats(redis_server)
    assert not queue.cancel("AbCdEfGhIjKlMn~4.2")  # unknown: the same one call
    assert function_calls(redis_server) == 1

    reset_stats(redis_server)
    more = queue.send_many([{"n": n} for n in range(40)], delay=3600)
    assert function_calls(redis_server) == len({shard_of_id(message_id) for message_id in more})
    # Two shards of four, interleaved: two calls.
    reset_stats(redis_server)
    two = [
        new_message(f"m{n}{shard_suffix(4, 1 + 2 * (n % 2))}", delay_us=10**9) for n in range(10)
    ]
    queue.store.send(two)
    assert function_calls(redis_server) == 2
    for message in two:
        stored = queue.peek(message.id)
        assert stored is not None
        assert stored.state == "pending"


# Fetching


def test_fetches_of_one_take_turns_over_the_shards(settings: Any) -> None:
    queue = sharded_queue(settings, "memory://", 4)
    store = sharded(queue)
    names = list(store.shards)
    store.send(
        [new_message(f"m{n}{shard_suffix(4, index)}") for index in range(4) for n in range(6)]
    )
    shards = []
    for _ in range(12):
        [delivery] = store.fetch(1).deliveries
        shards.append(shard_of_id(delivery.id))
    # Every shard in each round of four, in the same turn each round: none waits on another.
    first = names.index(shards[0])
    assert shards == [names[(first + n) % 4] for n in range(12)]


def test_a_listening_fetch_asks_only_the_shards_its_plan_has_due(
    redis_server: RedisServer, settings: Any
) -> None:
    queue = sharded_queue(settings, redis_server.url, 4)
    store = sharded(queue)
    subscription = store.subscribe_wakeups()
    try:
        store.fetch(10)  # the first look: every shard (the plan knows none)
        reset_stats(redis_server)
        assert store.fetch(10).deliveries == []  # all empty: every shard again, nothing due
        assert function_calls(redis_server) == 4
        store.send([new_message("due~4.2")])
        assert subscription.wait(timeout=5) is not None
        assert subscription.wait(timeout=0.1) is None

        reset_stats(redis_server)
        result = store.fetch(10)
        assert [delivery.id for delivery in result.deliveries] == ["due~4.2"]
        assert function_calls(redis_server) == 1  # shard 4.2 alone
        store.ack([(delivery.id, delivery.lease) for delivery in result.deliveries])
    finally:
        subscription.close()
    # Without anyone listening, the plan would miss what others send: every shard is asked.
    store.send([new_message("later~4.1")])
    reset_stats(redis_server)
    assert [delivery.id for delivery in store.fetch(10).deliveries] == ["later~4.1"]
    assert function_calls(redis_server) == 4


PAUSE_SECONDS = 3.0


def one_shard_a_master(
    redis_cluster: RedisClusterServers, settings: Any
) -> tuple[Queue, RedisServer, str]:
    """A queue of 3 shards on the session's cluster, with a short socket timeout and
    redis-py's own retries as they are (a call that timed out is not made again the
    general way: some ten more timeouts, the other shards held up meanwhile); a master
    other than the one the URL names (the client's first look at the cluster), and the
    name of the shard it holds."""
    redis_cluster.flush()
    queue = sharded_queue(settings, redis_cluster.url, 3, OPTIONS={"socket_timeout": 0.3})
    node, first, last = next(
        master for master in masters_of(redis_cluster) if master[0] is not redis_cluster.nodes[0]
    )
    [name] = [
        name
        for name, shard in sharded(queue).shards.items()
        if first <= slot_of(shard.keys) <= last
    ]
    return queue, node, name


@pytest.mark.cluster
@pytest.mark.parametrize("listening", [False, True])
def test_the_shards_of_a_paused_master_wait_while_the_others_keep_flowing(
    redis_cluster: RedisClusterServers,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    listening: bool,
) -> None:
    # A shard a master: the paused one's tries are the only ones that wait out a timeout.
    queue, node, on_paused = one_shard_a_master(redis_cluster, settings)
    store = sharded(queue)
    # Each try of the paused shard's fetch: when it began and ended, and whether it failed.
    tries: list[tuple[float, float, bool]] = []
    shard_fetch = store.shards[on_paused].fetch

    def timed_fetch(*args: Any, **kwargs: Any) -> FetchResult:
        started, failed = time.monotonic(), True
        try:
            result = shard_fetch(*args, **kwargs)
            failed = False
            return result
        finally:
            tries.append((started, time.monotonic(), failed))

    monkeypatch.setattr(store.shards[on_paused], "fetch", timed_fetch)
    ids = queue.send_many([{"n": n} for n in range(60)])
    # Due while the master is paused: the other masters' shards hand them out then.
    ids += queue.send_many([{"n": n} for n in range(60, 90)], delay=1)
    waiting = {message_id for message_id in ids if shard_of_id(message_id) == on_paused}
    assert 0 < len(waiting) < len(ids)
    subscription = store.subscribe_wakeups() if listening else None

    control = node.client(socket_timeout=5)
    control.client_pause(int(PAUSE_SECONDS * 1000), all=True)
    paused_at = time.monotonic()
    received: list[tuple[str, float]] = []
    request = 0
    try:
        while len(received) < len(ids) and time.monotonic() - paused_at < PAUSE_SECONDS + 10:
            # (A new request each time: a shard whose reply was lost gets the request it
            # lost again anyway, when it is next asked.)
            request += 1
            try:
                fetched = queue.fetch(100, fetcher="pause-test", request=str(request))
            except QueueUnavailable:  # every shard it asked failed
                time.sleep(0.01)
                continue
            at = time.monotonic() - paused_at
            received += [(message.id, at) for message in fetched.messages]
            if fetched.messages:
                queue.ack(fetched.messages)
            else:
                time.sleep(0.01)
    finally:
        control.close()
        if subscription is not None:
            subscription.close()

    got = Counter(message_id for message_id, _ in received)
    assert set(got) == set(ids), f"{len(set(ids) - set(got))} lost"
    assert max(got.values()) == 1
    # The other shards' messages, the ones due during the pause too, came while it lasted;
    # the paused shard's after it, tried again only once a second meanwhile.
    assert {message_id for message_id, at in received if at < PAUSE_SECONDS} == set(ids) - waiting
    assert any(failed for _, _, failed in tries)
    for (_, ended, failed), (started, _, _) in itertools.pairwise(tries):
        if failed:
            assert started - ended >= SHARD_RETRY_SECONDS - 0.05, (tries, paused_at)
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert sum(queue.stats()[state] for state in STATES) == 0


@pytest.mark.cluster
def test_a_fetch_repeated_after_its_only_due_shard_failed_asks_the_others_too(
    redis_cluster: RedisClusterServers, settings: Any
) -> None:
    """As the worker does: a fetch that raised is repeated with the same request. Its one
    due shard is on a paused master; the repeat must not ask that shard alone again (the
    others' messages would wait out the pause)."""
    queue, node, paused = one_shard_a_master(redis_cluster, settings)
    store = sharded(queue)
    live = next(name for name in store.shards if name != paused)

    def suffix(name: str) -> str:
        return "" if name == "0" else "~" + name

    store.send([new_message("on-paused" + suffix(paused), delay_us=300_000)])
    store.send([new_message("on-live" + suffix(live), delay_us=2_500_000)])
    subscription = store.subscribe_wakeups()
    control = node.client(socket_timeout=5)
    try:
        queue.fetch(10, fetcher="w", request="0")  # the plan learns both due times
        control.client_pause(int(PAUSE_SECONDS * 1000), all=True)
        paused_at = time.monotonic()
        request = 1
        received: dict[str, float] = {}
        while "on-live" + suffix(live) not in received and time.monotonic() - paused_at < 10:
            try:
                fetched = queue.fetch(10, fetcher="w", request=str(request))
            except QueueUnavailable:
                time.sleep(0.05)
                continue  # the same request again
            request += 1
            received.update((m.id, time.monotonic() - paused_at) for m in fetched.messages)
            queue.ack(fetched.messages)
            # Until the next due time, as the worker sleeps (its plan's: here the paused
            # shard's retry comes first, and finds it the only shard due).
            if fetched.next_ms is not None:
                time.sleep(min(max(fetched.next_ms - fetched.now_ms, 0), 1000) / 1000)
    finally:
        subscription.close()
        control.close()

    assert received["on-live" + suffix(live)] < PAUSE_SECONDS


# The invariant checker


def test_the_checker_names_a_message_in_a_shard_its_id_does_not_name(
    redis_server: RedisServer, settings: Any
) -> None:
    queue = sharded_queue(settings, redis_server.url, 4)
    store = sharded(queue)
    placed = queue.send_many([{"n": n} for n in range(20)], delay=3600)
    queue.send("in flight")
    fetch_when_due(queue, count=1)
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert (report.counts["pending"], report.counts["unack"], report.messages) == (20, 1, 21)

    store.shards["4.1"].send([new_message("AbCdEfGhIjKlMn~4.2", delay_us=10**9)])
    store.shards["4.3"].send([new_message("OpQrStUvWxYzAb", delay_us=10**9)])
    report = queue.check_invariants()
    assert [(p.kind, p.subject, p.detail) for p in report.problems] == [
        ("wrong-shard", "AbCdEfGhIjKlMn~4.2", "in shard 4.1; its id names 4.2"),
        ("wrong-shard", "OpQrStUvWxYzAb", "in shard 4.3; its id names 0"),
    ]
    assert report.messages == 23
    # Why it matters: whoever looks for them by id looks where the id says.
    assert queue.peek("AbCdEfGhIjKlMn~4.2") is None
    assert not queue.cancel("OpQrStUvWxYzAb")
    assert all(queue.peek(message_id) is not None for message_id in placed)


# Worker processes


@pytest.fixture
def cluster_workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.mark.cluster
@pytest.mark.timeout(90)
def test_worker_processes_on_a_sharded_cluster_lose_nothing_when_one_is_killed(
    redis_cluster: RedisClusterServers, settings: Any, cluster_workers: list[WorkerProcess]
) -> None:
    redis_cluster.flush()
    url = redis_cluster.url
    # A killed worker's deliveries come back after MAX_CONSUME_DURATION: short enough to wait
    # for, long enough that the survivor's own never run out on a loaded machine.
    queue = sharded_queue(settings, url, 6, MAX_CONSUME_DURATION=3, NACK_REDELIVERY_DELAY=0)
    env = {"DQ_TEST_SHARDS": "6", "DQ_TEST_MAX_CONSUME": "3"}
    killed, survivor = (spawn(cluster_workers, url, "--concurrency", "2", **env) for _ in range(2))
    for worker in (killed, survivor):
        worker.wait_for_line("queue 'default'")
    # 5 ms a message: the drain lasts seconds, so the kill lands mid-drain.
    ids = queue.send_many([{"n": n, "do": "sleep", "seconds": 0.005} for n in range(600)])
    wait_for(
        lambda: sum(entry["pid"] == killed.pid for entry in events("start")) >= 20,
        timeout=30,
        what="the first worker under way",
    )
    killed.signal(signal.SIGKILL)
    killed.wait(timeout=10)
    done_before = {entry["id"] for entry in events("done")}
    assert len(done_before) < len(ids)  # mid-drain

    wait_for(
        lambda: {entry["id"] for entry in events("done")} >= set(ids),
        timeout=40,
        what="every message handled",
    )
    log = read_log()
    handled = Counter(entry["id"] for entry in log if entry["event"] == "done")
    assert set(handled) == set(ids)
    started_by_killed = {e["id"] for e in log if e["event"] == "start" and e["pid"] == killed.pid}
    # Twice only what the killed worker held (running, fetched ahead, or done but not acked).
    assert {message_id for message_id, times in handled.items() if times > 1} <= started_by_killed
    assert max(handled.values()) <= 2
    by_survivor = {e["id"] for e in log if e["event"] == "done" and e["pid"] == survivor.pid}
    assert {shard_of_id(message_id) for message_id in by_survivor} == set(sharded(queue).shards)
    survivor_starts = Counter(
        e["id"] for e in log if e["event"] == "start" and e["pid"] == survivor.pid
    )
    assert max(survivor_starts.values()) == 1  # the survivor's own never ran out
    wait_for(
        lambda: sum(queue.stats()[state] for state in STATES) == 0,
        timeout=10,
        what="the queue empty",
    )
    stats = queue.stats()
    # What the killed worker held came back through its deadline, each once, and nothing
    # else failed.
    assert stats["timed_out_total"] >= 1
    assert (stats["failed_total"], stats["exhausted_total"]) == (stats["timed_out_total"], 0)
    assert stats["acked_total"] == len(ids)
    assert queue.check_invariants().ok
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0, survivor.output


def pump(subscription: Any) -> None:
    """Let the subscription tell the plan every wake-up published so far."""
    while subscription.wait(timeout=0.2) is not None:
        pass


def test_a_message_sent_while_the_subscription_was_lost_is_not_starved_by_busy_shards(
    redis_server: RedisServer, settings: Any
) -> None:
    """The listener lost its subscription and subscribed again (a new ShardedWakeups, as
    WakeupListener does). A message sent to shard 2.1 before the new subscription took
    effect went unheard; the plan still says 2.1 is empty. While shard 0 always has work
    due, a fetch asks only the due shards, and later sends to 2.1 publish nothing (its
    head is older): 2.1 would never be asked."""
    redis_server.client().flushall()
    queue = sharded_queue(settings, redis_server.url, 2)
    store = sharded(queue)
    assert isinstance(store, ShardedStore)
    first = store.subscribe_wakeups()
    assert store.fetch(10).deliveries == []  # every shard asked: all empty now
    first.close()  # the subscription is lost (the listener closes it and backs off)
    assert store.fetch(10).deliveries == []  # not listening: every shard asked, empty
    store.send([new_message("starved~2.1")])  # published to no one
    second = store.subscribe_wakeups()  # subscribed again
    try:
        fetched = []
        for n in range(20):
            store.send([new_message(f"busy{n}"), new_message(f"more{n}~2.1")])
            pump(second)
            result = store.fetch(1)
            fetched += [delivery.id for delivery in result.deliveries]
            store.ack([(d.id, d.lease) for d in result.deliveries])
        assert "starved~2.1" in fetched, fetched
    finally:
        second.close()


def test_a_shard_whose_wake_up_was_lost_is_asked_again_while_others_stay_due(
    redis_server: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pub/sub delivers at most once: a wake-up lost on its way leaves the plan saying its
    shard is empty, and later sends there publish nothing behind the older head. While
    shard 0 always has work due, a fetch would ask only shard 0; a shard not asked for
    LOOK_AGAIN_SECONDS joins a fetch all the same."""
    monkeypatch.setattr(shard_fetch, "LOOK_AGAIN_SECONDS", 0.3)
    redis_server.client().flushall()
    store = sharded(sharded_queue(settings, redis_server.url, 2))
    subscription = store.subscribe_wakeups()
    try:
        assert store.fetch(10).deliveries == []  # every shard asked: all empty
        store.send([new_message("lost~2.1")])
        pump(subscription)
        with store._lock:
            store._plans["2.1"].due_ms = math.inf  # as if its wake-up had never come
        fetched: list[str] = []
        deadline = time.monotonic() + 3
        while "lost~2.1" not in fetched and time.monotonic() < deadline:
            store.send([new_message(f"busy{len(fetched)}a"), new_message(f"busy{len(fetched)}b")])
            pump(subscription)
            result = store.fetch(1)
            fetched += [delivery.id for delivery in result.deliveries]
            store.ack([(delivery.id, delivery.lease) for delivery in result.deliveries])
            time.sleep(0.02)
        assert "lost~2.1" in fetched, fetched
    finally:
        subscription.close()


def test_a_server_that_times_out_is_waited_for_once_per_fetch_not_once_per_shard(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six shards on one server that stops answering (paused): the first shard's fetch
    waits out its timeout, and the others on that server are held back with it rather than
    asked, each to wait out a timeout of its own. Once it answers, they are fetched."""
    server = RedisServer()
    try:
        queue = sharded_queue(settings, server.url, 6, OPTIONS={"socket_timeout": 0.3})
        store = sharded(queue)
        sent = {message_id for message_id in queue.send_many([{"n": n} for n in range(30)])}
        asked: list[str] = []
        for name, shard in store.shards.items():
            real = shard.fetch

            def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
                asked.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(shard, "fetch", counted)
        server.client(socket_timeout=5).client_pause(1500, all=True)
        with pytest.raises(QueueUnavailable):
            queue.fetch(100)
        assert len(asked) == 1, asked
        time.sleep(1.6)  # the pause ends; the held shards' retry time has come
        fetched = {message.id for message in queue.fetch(100).messages}
        assert fetched == sent
    finally:
        server.close()


def test_a_worker_that_times_out_committing_holds_the_other_shards_of_that_server_too(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two messages on two shards of one server, both handled while it stops answering
    (paused): each flush tries one commit and holds the other shard's with it, rather than
    wait out a second timeout at once; both are acked once the server answers again."""
    server = RedisServer()
    worker: Worker | None = None
    thread: threading.Thread | None = None
    try:
        queue = sharded_queue(settings, server.url, 6, OPTIONS={"socket_timeout": 0.3})
        store = sharded(queue)
        names = list(store.shards)[1:3]
        ids = []
        for name in names:
            message_id = next(
                placed
                for placed in store.place([f"m{n}" for n in range(200)])
                if shard_of_id(placed) == name
            )
            store.send([new_message(message_id, {"n": message_id})])
            ids.append(message_id)
        started, release = threading.Semaphore(0), threading.Event()
        attempts: list[tuple[float, list[str]]] = []
        acked: list[str] = []
        real_ack = queue.ack

        def counted_ack(messages: Any, **kwargs: Any) -> Any:
            attempts.append((time.monotonic(), [shard_of_id(m.id) for m in messages]))
            done = real_ack(messages, **kwargs)
            acked.extend(done)
            return done

        monkeypatch.setattr(queue, "ack", counted_ack)

        def slow(message: Message) -> None:
            started.release()
            release.wait(10)

        worker = Worker([(queue, slow)], concurrency=2, heartbeat_interval=60)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        assert started.acquire(timeout=10)
        assert started.acquire(timeout=10)
        server.client(socket_timeout=5).client_pause(2500, all=True)
        paused_at = time.monotonic()
        release.set()
        wait_for(lambda: set(acked) == set(ids), timeout=15, what="both acks committed")
        during = [at for at, _ in attempts if at < paused_at + 2.5]
        assert len(during) >= 2, attempts
        gaps = [later - earlier for earlier, later in itertools.pairwise(during)]
        # A timeout is 0.3 s; a held shard waits SHARD_RETRY_SECONDS.
        assert min(gaps) > 0.6, attempts
    finally:
        if worker is not None and thread is not None:
            worker.request_stop()
            thread.join(timeout=10)
        server.close()
