"""The queue's Lua as one Redis Functions library: what is loaded, when it is loaded again,
two releases side by side, a cluster's calls, and the EVALSHA scripts served to a server
that refuses Functions."""

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.scripts import (
    ALLOWED_OUT_OF_MEMORY,
    FIRST_KEY_ONLY,
    READ_ONLY,
    SCRIPT_NAMES,
    _library,
    _read,
    library,
)
from tests.helpers import fetch_when_due, redis_store
from tests.redis_servers import RedisClusterServers, RedisServer


def functions_of(client: Any) -> dict[str, dict[str, list[bytes]]]:
    """Every function Redis holds, by library: function name -> flags (FUNCTION LIST)."""
    libraries = {}
    for entry in client.function_list():
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        libraries[fields[b"library_name"].decode()] = {
            dict(zip(f[::2], f[1::2], strict=True))[b"name"].decode(): sorted(
                dict(zip(f[::2], f[1::2], strict=True))[b"flags"]
            )
            for f in fields[b"functions"]
        }
    return libraries


def test_every_script_is_a_function_of_one_versioned_library(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    client.function_flush()
    get_queue().stats()  # the first call finds the library missing and loads it

    lib = library()
    assert lib.name.startswith("delayqueue_")
    functions = functions_of(client)[lib.name]
    assert set(functions) == {lib.function(name) for name in SCRIPT_NAMES}
    for name in SCRIPT_NAMES:
        if name in READ_ONLY:
            expected = [b"no-writes"]
        elif name in ALLOWED_OUT_OF_MEMORY:
            expected = [b"allow-oom"]
        else:
            expected = []
        assert functions[lib.function(name)] == expected, name
    assert "send" not in ALLOWED_OUT_OF_MEMORY


def test_read_only_steps_are_called_with_fcall_ro(redis_server: RedisServer) -> None:
    queue = get_queue()
    queue.send("x")  # loaded
    client = redis_server.client()
    client.config_resetstat()
    queue.stats()
    queue.peek("x")
    queue.list_messages("pending")
    queue.send("y")
    calls = {name: row["calls"] for name, row in client.info("commandstats").items()}
    assert calls["cmdstat_fcall_ro"] == 3
    assert calls["cmdstat_fcall"] == 1
    assert "cmdstat_evalsha" not in calls


def _flush_functions(queue: Queue) -> None:
    redis_store(queue).client.function_flush()  # on a cluster: on every primary


def test_the_library_is_loaded_again_after_function_flush(redis_queue: Queue) -> None:
    queue = redis_queue
    queue.send("before")
    if redis_store(queue).uses_scripts:
        redis_store(queue).client.script_flush()  # the user may not flush functions
    else:
        _flush_functions(queue)
    message_id = queue.send("after")
    delivered = fetch_when_due(queue, count=2)
    assert message_id in {m.id for m in delivered}


def test_a_cluster_loads_the_library_on_the_node_that_lacks_it(
    redis_cluster: RedisClusterServers, settings: Any
) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {"default": {"URL": redis_cluster.url}}
    queue = get_queue()
    queue.send("loaded")
    client = redis_store(queue).client
    client.function_flush()  # on every primary
    assert queue.stats()["pending"] == 1

    serving = redis_cluster.master_for(queue.store.keys.key("pending"))
    for node in redis_cluster.nodes:
        held = functions_of(node.client())
        assert (library().name in held) == (node is serving), node.port


def test_a_cluster_call_goes_straight_to_its_node(
    redis_cluster: RedisClusterServers, settings: Any
) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {"default": {"URL": redis_cluster.url}}
    queue = get_queue()
    queue.send("warm")
    for node in redis_cluster.nodes:
        node.client().config_resetstat()
    queue.send("one call")
    queue.stats()
    calls: dict[str, int] = {}
    for node in redis_cluster.nodes:
        for name, row in node.client().info("commandstats").items():
            calls[name] = calls.get(name, 0) + row["calls"]
    # Nothing but the two calls: redis-py's own routing of FCALL would first ask a node
    # for the keys of each (COMMAND GETKEYS).
    assert (calls["cmdstat_fcall"], calls["cmdstat_fcall_ro"]) == (1, 1)
    assert "cmdstat_command|getkeys" not in calls


def _send_call_seen_by(node_client: Any, send: Any) -> list[str]:
    """The words of the first FCALL the node runs while ``send()`` runs (MONITOR)."""
    with node_client.monitor() as monitor:
        send()
        while True:
            words = monitor.next_command()["command"].split()
            if words[0] == "FCALL":
                return list(words)


def test_a_send_declares_every_key_it_touches_on_a_cluster(
    redis_cluster: RedisClusterServers, settings: Any
) -> None:
    # Elsewhere a send gives its layout's first key alone (FIRST_KEY_ONLY); on a cluster
    # all ten: while a slot migrates, a node refuses a script touching a key it did not
    # declare, where declared keys get the redirection the client follows.
    redis_cluster.flush()
    settings.DELAYQUEUES = {"default": {"URL": redis_cluster.url}}
    queue = get_queue()
    serving = redis_cluster.master_for(queue.store.keys.key("pending"))
    words = _send_call_seen_by(serving.client(), lambda: queue.send("declared"))
    assert words[2:3] == [str(len(queue.store.keys.layout))]
    assert words[3 : 3 + len(queue.store.keys.layout)] == queue.store.keys.layout
    assert queue.stats()["pending"] == 1


def test_a_send_gives_its_first_key_alone_off_a_cluster(
    redis_server: RedisServer, settings: Any
) -> None:
    redis_server.client().flushall()
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url}}
    queue = get_queue()
    words = _send_call_seen_by(redis_server.client(), lambda: queue.send("one key"))
    assert words[2:4] == ["1", queue.store.keys.layout[0]]
    assert queue.stats()["pending"] == 1


def test_two_releases_run_side_by_side_on_one_redis(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.function_flush()
    # Another release's library: other text, so another name, and functions of its own.
    previous = _library("delayqueue_previousrelease").replace("budget", "budget ")
    client.function_load(previous)
    queue = get_queue()
    message_id = queue.send("new")

    libraries = functions_of(client)
    assert set(libraries) == {"delayqueue_previousrelease", library().name}
    keys = queue.store.keys.layout
    reply = client.fcall_ro("delayqueue_previousrelease_stats", len(keys), *keys)
    assert reply[0] == 1  # the previous release reads the same queue
    assert fetch_when_due(queue)[0].id == message_id


def test_async_calls_load_the_library_too(redis_configure: Any) -> None:
    queue = redis_configure()
    queue.stats()
    if not redis_store(queue).uses_scripts:
        _flush_functions(queue)

    async def scenario() -> int:
        await queue.asend("async")
        return int((await queue.astats())["pending"])

    assert asyncio.run(scenario()) == 1


@pytest.fixture
def refused_function_load(redis_server: RedisServer) -> Iterator[str]:
    """A URL of the private server as a user that may call functions but not load them,
    with no library loaded."""
    admin = redis_server.client()
    admin.function_flush()
    admin.acl_setuser(
        "no-function-load",
        enabled=True,
        passwords=["+pw"],
        keys=["~*"],
        channels=["*"],
        commands=["+@all", "-function"],
    )
    yield f"redis://no-function-load:pw@127.0.0.1:{redis_server.port}/0"
    admin.acl_deluser("no-function-load")


def test_a_server_that_refuses_function_load_is_served_scripts(
    refused_function_load: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(DELAYQUEUES={"default": {"URL": refused_function_load}}):
        queue = get_queue()
        with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
            message_id = queue.send("as a script")
        assert "its Lua runs as EVALSHA scripts" in caplog.text
        client = redis_server.client()
        client.config_resetstat()
        [message] = fetch_when_due(queue)
        assert message.id == message_id
        assert queue.ack([message]) == {message_id}
        calls = {name: row["calls"] for name, row in client.info("commandstats").items()}
        assert calls["cmdstat_evalsha"] >= 2
        assert "cmdstat_fcall" not in calls
        assert functions_of(client) == {}


def test_a_function_given_its_first_key_alone_derives_the_same_layout() -> None:
    # send.lua gets KEYS[1] alone (FIRST_KEY_ONLY); layout_of in the prelude names the rest
    # as QueueKeys.layout does, in its order, from "<tag>:pending".
    prelude = _read("_prelude")
    table = re.search(r"local LAYOUT_PARTS = \{(.*?)\}", prelude, re.DOTALL)
    assert table is not None
    parts = re.findall(r"'([a-z_]+)'", table.group(1))
    for keys in (QueueKeys("dq", "emails"), QueueKeys("dq", "emails", shard="3.1.3")):
        assert [key.removeprefix(f"{keys.tag}:") for key in keys.layout] == parts
        assert keys.layout[0] == f"{keys.tag}:pending"  # what string.sub(first, 1, -8) cuts
    assert set(SCRIPT_NAMES) >= FIRST_KEY_ONLY


def test_the_names_kept_per_queue_never_mix_queues_up_past_their_bound(
    redis_server: RedisServer,
) -> None:
    # The library keeps each queue's derived key names from one call to the next
    # (`kept_names` in the prelude), and empties them when they hold KEPT_ENTRIES entries:
    # across more queues than that, called in turn and twice over, every call still reads
    # and writes its own queue's keys.
    client = redis_server.client()
    client.flushall()
    lib = library()
    client.function_load(lib.code, replace=True)
    bound = re.search(r"local KEPT_ENTRIES = (\d+)", _read("_prelude"))
    assert bound is not None
    queues = [QueueKeys("dq", f"q{n}") for n in range(int(bound.group(1)) + 50)]
    for turn in range(2):
        for n, keys in enumerate(queues):
            args = (keys.wakeup_channel, 1, f"m{n}-{turn}", "", 0, 0, f'{{"n": {n}}}')
            client.fcall(lib.function("send"), 1, keys.layout[0], *args)
    for n, keys in enumerate(queues):
        fetched = client.fcall(
            lib.function("fetch"),
            11,
            *keys.layout,
            keys.key("fetch:w"),
            *(keys.wakeup_channel, 2, 30000, 100, "r", "", 0, ""),
        )
        deliveries = fetched[3]
        assert deliveries[0::6] == [f"m{n}-0".encode(), f"m{n}-1".encode()]
        assert deliveries[1::6] == [f'{{"n": {n}}}'.encode()] * 2
    # Per queue: payload, meta, unack, fetch:w, and the metrics history's hour (or two).
    kept = [name for name in client.scan_iter(count=1000) if b":metrics:m:" not in name]
    assert len(kept) == 4 * len(queues)
