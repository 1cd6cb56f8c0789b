"""A Redis that may evict the queue's keys: the worker, delayqueue_check and delayqueue_stats
say so; and what the invariant checker can tell after keys were evicted."""

import logging
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.store import parts
from tests.helpers import redis_store
from tests.redis_servers import RedisServer

ALLKEYS = (
    "Redis's maxmemory-policy is allkeys-lru: at its maxmemory (104857600 bytes) it evicts "
    "any key, the queue's included, and messages are lost without a word (whole queues at "
    "once). Give the queue a Redis whose maxmemory-policy is noeviction."
)
VOLATILE = (
    "Redis's maxmemory-policy is volatile-lfu: once a maxmemory is set it may evict the "
    "queue's keys that carry a TTL: worker heartbeats (a live worker then looks gone), fetch "
    "replay records (a fetch whose reply was lost then gets new messages, and the lost ones "
    "come back only after MAX_CONSUME_DURATION) and task results. Messages "
    "carry none and are never evicted; noeviction keeps the rest too."
)


@pytest.fixture
def server_with(settings: Any) -> Iterator[Callable[..., RedisServer]]:
    """``server_with(*redis_server_args)``: a Redis of the test's own, the default queue on it."""
    started: list[RedisServer] = []

    def start(*args: str, url: Callable[[RedisServer], str] = lambda s: s.url) -> RedisServer:
        server = RedisServer(*args)
        started.append(server)
        settings.DELAYQUEUES = {
            "default": {"URL": url(server), "HANDLER": "tests.worker_handlers.handle"}
        }
        return server

    yield start
    for server in started:
        server.close()


def run_worker(caplog: pytest.LogCaptureFixture) -> str:
    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    return caplog.text


def check() -> str:
    out = StringIO()
    call_command("delayqueue_check", stdout=out)
    return out.getvalue()


def stats_stderr() -> str:
    err = StringIO()
    call_command("delayqueue_stats", "--json", stdout=StringIO(), stderr=err)
    return err.getvalue()


def test_an_allkeys_policy_is_a_loud_warning_everywhere(
    server_with: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server_with("--maxmemory-policy", "allkeys-lru", "--maxmemory", "100mb")
    assert "WARNING  delayqueue_django.worker:run_delayqueue.py" in run_worker(caplog)
    assert f"queue=default: {ALLKEYS}" in caplog.text
    assert check().splitlines()[1:] == [f"  warning: {ALLKEYS}"]
    assert stats_stderr() == f"warning: queue 'default': {ALLKEYS}\n"


def test_a_volatile_policy_names_the_keys_it_may_evict(
    server_with: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server_with("--maxmemory-policy", "volatile-lfu")
    assert "INFO     delayqueue_django.worker:run_delayqueue.py" in run_worker(caplog)
    assert f"queue=default: {VOLATILE}" in caplog.text
    assert check().splitlines()[1:] == [f"  note: {VOLATILE}"]
    assert stats_stderr() == f"note: queue 'default': {VOLATILE}\n"


def test_noeviction_draws_no_word(
    server_with: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server_with("--maxmemory-policy", "noeviction", "--maxmemory", "100mb")
    assert "maxmemory" not in run_worker(caplog)
    assert len(check().splitlines()) == 1
    assert stats_stderr() == ""


def test_a_redis_refusing_config_is_said_to_be_unchecked(
    server_with: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    # As managed services refuse CONFIG: an ACL user without it.
    server = server_with(url=lambda s: f"redis://queue:secret@127.0.0.1:{s.port}/0")
    server.client().acl_setuser(
        "queue",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    text = run_worker(caplog)
    assert "queue=default: could not check Redis's maxmemory-policy (CONFIG GET refused: " in text
    assert "make sure it is noeviction: an allkeys-* policy deletes queues without a word." in text
    assert "  note: could not check Redis's maxmemory-policy" in check()
    assert stats_stderr().startswith("note: queue 'default': could not check")


@pytest.mark.cluster
def test_the_policy_is_read_where_the_queue_lives_on_redis_cluster(
    settings: Any, redis_cluster: Any
) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {"default": {"URL": redis_cluster.url}}
    node = redis_cluster.master_for("{delayqueue:default}:pending").client()
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        assert stats_stderr().startswith(
            "warning: queue 'default': Redis's maxmemory-policy is allkeys-lru"
        )
    finally:
        node.config_set("maxmemory-policy", "noeviction")
    assert stats_stderr() == ""


@pytest.mark.cluster
def test_a_sharded_queue_is_advised_per_master_naming_its_shards_there(
    settings: Any, redis_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {
        "default": {
            "URL": redis_cluster.url,
            "SHARDS": 6,
            "HANDLER": "tests.worker_handlers.handle",
        }
    }
    stores = parts(get_queue().store)
    master = redis_cluster.master_for(stores["0"].keys.key("pending"))
    there = [
        name
        for name, store in stores.items()
        if redis_cluster.master_for(store.keys.key("pending")) is master
    ]
    assert len(there) == 2  # two shards a master, shard 0 first
    node = master.client()
    node.config_set("maxmemory-policy", "allkeys-lru")
    said = f"shards {', '.join(there)} (on 127.0.0.1:{master.port}): {ALLKEYS}".replace(
        "at its maxmemory (104857600 bytes)", "once a maxmemory is set"
    )
    try:
        assert stats_stderr() == f"warning: queue 'default': {said}\n"
        assert check().splitlines()[-1] == f"  warning: {said}"
        assert f"queue=default: {said}" in run_worker(caplog)
    finally:
        node.config_set("maxmemory-policy", "noeviction")
    assert stats_stderr() == ""


def test_a_sharded_queue_on_one_server_is_advised_once(
    server_with: Callable[..., RedisServer], settings: Any
) -> None:
    server_with("--maxmemory-policy", "allkeys-lru", "--maxmemory", "100mb")
    settings.DELAYQUEUES["default"]["SHARDS"] = 4
    assert stats_stderr() == f"warning: queue 'default': {ALLKEYS}\n"


# What the checker can tell after keys were evicted


@pytest.mark.parametrize("key", ["pending", "ready", "unack", "garbage", "payload", "meta"])
def test_a_queue_key_evicted_on_its_own_is_reported(redis_queue: Queue, key: str) -> None:
    queue = redis_queue
    queue.send("pending", delay=3600)
    queue.send("dead", retry_count=0)
    [dead] = queue.fetch(1).messages
    queue.bury([dead])
    queue.send_many(["unack", "ready"])
    assert len(queue.fetch(1).messages) == 1  # stages both, hands out one
    stats = queue.stats()
    assert [stats[state] for state in ("pending", "ready", "unack", "garbage")] == [1, 1, 1, 1]
    assert queue.check_invariants().ok

    redis_store(queue).client.delete(queue.store.keys.key(key))  # as an eviction would

    report = queue.check_invariants()
    assert not report.ok
    expected = {
        "payload": {"no-payload"},
        "meta": {"no-meta"},
        # A message never handed out has no meta record: only its payload is left behind.
        "pending": {"orphan-payload"},
        "ready": {"orphan-payload"},
        # and the exhaustion still owed, and the record of its burial's attempt, now belong
        # to no dead letter
        "garbage": {"orphan-payload", "orphan-meta", "unannounced-not-dead", "orphan-history"},
    }.get(key, {"orphan-payload", "orphan-meta"})
    assert {problem.kind for problem in report.problems} == expected


def test_a_queue_whose_every_key_was_evicted_reads_as_an_empty_queue(redis_queue: Queue) -> None:
    # Nothing left in Redis tells the two apart: hence the warnings above.
    queue = redis_queue
    queue.send_many(["a", "b"], delay=60)
    client = redis_store(queue).client
    for key in queue.store.keys.layout:
        client.delete(key)
    report = queue.check_invariants()
    assert (report.ok, report.messages) == (True, 0)
