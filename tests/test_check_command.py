"""``manage.py delayqueue_check``: a verdict per queue, the problems, and exit codes."""

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.memory import get_server
from delayqueue_django.engine.sharding.store import parts
from tests.backends import SHARDED_BACKENDS


def check(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("delayqueue_check", *args, stdout=out, **options)
    return out.getvalue()


def test_healthy_queues_pass_with_their_counts() -> None:
    get_queue().send("later", delay=60)
    get_queue().send("now")
    assert check().splitlines() == [
        "default: ok; 2 messages (pending 2, ready 0, unack 0, retry 0, garbage 0)",
        "other: ok; 0 messages (pending 0, ready 0, unack 0, retry 0, garbage 0)",
    ]


def test_problems_are_listed_and_exit_3(redis_server: Any) -> None:
    queue = get_queue()
    key = queue.store.keys.key
    raw = redis_server.client()
    for n in range(3):
        raw.hset(key("payload"), f"orphan-{n}", "{}")
    out = StringIO()
    with pytest.raises(CommandError, match="problems found in default") as caught:
        call_command("delayqueue_check", "default", "--show", "2", stdout=out)
    assert caught.value.returncode == 3
    assert out.getvalue().splitlines() == [
        "default: 3 problem(s); 3 messages (pending 0, ready 0, unack 0, retry 0, garbage 0)",
        "  orphan-payload: orphan-0: a payload for a message in no state",
        "  orphan-payload: orphan-1: a payload for a message in no state",
        "  ... and 1 more",
    ]


def test_damage_set_aside_is_noted_without_failing(redis_server: Any) -> None:
    queue = get_queue()
    broken = queue.send("x")
    redis_server.client().hdel(queue.store.keys.key("payload"), broken)
    queue.fetch(1)
    assert "note: 1 dead letter(s) lack a readable payload or meta record" in check("default")


def test_unreachable_redis_exits_1(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}
    }
    out = StringIO()
    with pytest.raises(CommandError, match="Redis unavailable for default") as caught:
        call_command("delayqueue_check", stdout=out)
    assert caught.value.returncode == 1
    assert out.getvalue().startswith("default: Redis unavailable: ")


def test_an_unknown_queue_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no queue named 'nope'"):
        check("nope")


def test_no_queue_configured_is_a_command_error(settings: Any) -> None:
    # Checking nothing is no "no problem": exit 1, as the other commands do.
    settings.DELAYQUEUES = {}
    with pytest.raises(CommandError, match="DELAYQUEUES defines no queue") as caught:
        check()
    assert caught.value.returncode == 1


def orphan_payload(queue: Queue, shard: str, message_id: str) -> None:
    """A payload for a message in no state, written into one shard's keys."""
    store = parts(queue.store)[shard]
    if queue.config.memory_name is not None:
        get_server(queue.config.memory_name).state(store.keys.tag).payloads[message_id] = "{}"
    else:
        redis_store_of(store).client.hset(store.keys.key("payload"), message_id, "{}")


def redis_store_of(store: Any) -> RedisStore:
    assert isinstance(store, RedisStore)
    return store


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_a_sharded_queue_is_checked_shard_by_shard_each_problem_under_its_own(
    configure: Callable[..., Queue],
) -> None:
    queue = configure()
    for n in range(20):
        queue.send({"n": n}, delay=60)
    stores = parts(queue.store)
    names = list(stores)
    lines = check("default").splitlines()
    assert lines[0] == "default: ok; 20 messages (pending 20, ready 0, unack 0, retry 0, garbage 0)"
    assert len(lines) == 1 + len(stores)
    for line, (name, store) in zip(lines[1:], stores.items(), strict=True):
        pending = store.stats()["pending"]
        assert line == (
            f"  shard {name}: ok; {pending} messages "
            f"(pending {pending}, ready 0, unack 0, retry 0, garbage 0)"
        )

    damaged = names[2]
    orphan_payload(queue, damaged, "orphan-1")
    orphan_payload(queue, damaged, "orphan-2")
    out = StringIO()
    with pytest.raises(CommandError, match="problems found in default") as caught:
        call_command("delayqueue_check", "default", "--show", "1", stdout=out)
    assert caught.value.returncode == 3
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("default: 2 problem(s); 22 messages (pending 20,")
    at = lines.index(next(line for line in lines if line.startswith(f"  shard {damaged}: ")))
    assert lines[at].startswith(f"  shard {damaged}: 2 problem(s); ")
    assert lines[at + 1] == "    orphan-payload: orphan-1: a payload for a message in no state"
    assert lines[at + 2].startswith("  shard ")  # --show 1: the second is not listed
    assert lines[-1] == "  ... and 1 more"


@pytest.mark.cluster
def test_a_shard_that_cannot_be_reached_exits_1_the_others_checked(
    shards_down: list[str],
) -> None:
    queue = get_queue()
    out = StringIO()
    with pytest.raises(CommandError, match="Redis unavailable for default") as caught:
        call_command("delayqueue_check", stdout=out)
    assert caught.value.returncode == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        f"default: Redis unavailable for shard(s) {', '.join(shards_down)}; the other 4 "
        "shard(s): ok; 0 messages (pending 0, ready 0, unack 0, retry 0, garbage 0)"
    )
    for line, name in zip(lines[1:], parts(queue.store), strict=True):
        if name in shards_down:
            assert line.startswith(f"  shard {name}: Redis unavailable: Error ")
        else:
            assert line.startswith(f"  shard {name}: ok; 0 messages")
