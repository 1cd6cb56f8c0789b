"""Outcome records (issue #35, HISTORY_RETENTION) in Redis itself: the option's checks, the
keys and their TTL (Redis reclaims them; nobody sweeps), what an ack costs with the option
off (not one command more) and on, and bad data (a foreign-typed key, a damaged record)
shown as damaged, never raised."""

import logging
from datetime import timedelta
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.checks import check_delayqueues
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.outcomes import DAMAGED_OUTCOME
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.worker import Worker
from tests.helpers import redis_store, wait_for
from tests.redis_servers import RedisServer

DAY_MS = 24 * 3600 * 1000
WORKER = "host-1:4242:a1b2c3"


def test_bad_retentions_are_check_errors(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "a": {"REDIS": "redis", "HISTORY_RETENTION": "a day"},
        "b": {"REDIS": "redis", "HISTORY_RETENTION": 0},
        "c": {"REDIS": "redis", "HISTORY_RETENTION": timedelta(days=4000)},
        "fine": {"REDIS": "redis", "HISTORY_RETENTION": timedelta(days=1)},
        "seconds": {"REDIS": "redis", "HISTORY_RETENTION": 90.5},
        "off": {"REDIS": "redis", "HISTORY_RETENTION": None},
    }
    found = [(error.id, error.msg) for error in check_delayqueues()]
    tail = "(at most 3660 days), or None to keep no outcome records; not"
    assert found == [
        (
            "delayqueue_django.E080",
            "DELAYQUEUES['a']['HISTORY_RETENTION'] must be a positive number of seconds or "
            f"a timedelta {tail} 'a day'.",
        ),
        (
            "delayqueue_django.E080",
            "DELAYQUEUES['b']['HISTORY_RETENTION'] must be a positive number of seconds or "
            f"a timedelta {tail} 0.",
        ),
        (
            "delayqueue_django.E080",
            "DELAYQUEUES['c']['HISTORY_RETENTION'] must be a positive number of seconds or "
            f"a timedelta {tail} datetime.timedelta(days=4000).",
        ),
    ]
    with pytest.raises(QueueConfigurationError, match="E080"):
        get_queue("fine")


def test_the_retention_is_read_in_ms(settings: Any, redis_server: RedisServer) -> None:
    settings.DELAYQUEUES = {
        "fine": {"URL": redis_server.url, "HISTORY_RETENTION": timedelta(days=1)},
        "seconds": {"URL": redis_server.url, "HISTORY_RETENTION": 90.5},
        "off": {"URL": redis_server.url},
    }
    assert get_queue("fine").config.history_retention_ms == DAY_MS
    assert get_queue("seconds").config.history_retention_ms == 90_500
    assert get_queue("off").config.history_retention_ms is None
    assert get_queue("off").store.limits.outcome_ms == 0


def kept_queue(settings: Any, redis_server: RedisServer, **options: Any) -> Queue:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, **options}}
    return get_queue()


def test_the_records_are_keys_of_the_queue_tag_that_redis_expires(
    settings: Any, redis_server: RedisServer
) -> None:
    queue = kept_queue(settings, redis_server, HISTORY_RETENTION=timedelta(days=1))
    message_id = queue.send({"n": 1}, key="order:42")
    [message] = queue.fetch(1, fetcher=WORKER).messages
    queue.ack([message], fetcher=WORKER)
    client, tag = redis_store(queue).client, queue.store.keys.tag
    record = client.get(f"{tag}:ended:{message_id}")
    assert isinstance(record, bytes)
    state, ended_ms, attempts, size, rest = record.split(b":", 4)
    assert (state, attempts, size) == (b"acked", b"1", str(len(WORKER)).encode())
    assert rest == WORKER.encode() + b"order:42"
    found = queue.message(message_id)
    assert found is not None
    assert found.ended_at is not None
    assert int(found.ended_at.timestamp() * 1000) == int(ended_ms)
    assert client.get(f"{tag}:ended_key:order:42") == message_id.encode()
    for name in (f"{tag}:ended:{message_id}", f"{tag}:ended_key:order:42"):
        assert 0 < client.pttl(name) <= DAY_MS
    # What Redis does when the TTL runs out, without waiting a day for it.
    client.pexpire(f"{tag}:ended:{message_id}", 1)
    client.pexpire(f"{tag}:ended_key:order:42", 1)
    wait_for(lambda: client.exists(f"{tag}:ended:{message_id}") == 0, what="the TTL")
    assert queue.message(message_id) is None
    assert queue.lookup("order:42") is None


def commands_of_an_ack(queue: Queue, *, keyed: bool) -> dict[str, int]:
    """The commands Redis ran for one ack (INFO commandstats: calls per command, those of
    the scripts included)."""
    queue.send({"n": 1}, key="k" if keyed else None)
    [message] = queue.fetch(1, fetcher=WORKER).messages
    client = redis_store(queue).client
    client.config_resetstat()
    assert queue.ack([message], fetcher=WORKER) == {message.id}
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_an_ack_costs_nothing_more_with_the_option_off(
    settings: Any, redis_server: RedisServer, keyed: bool
) -> None:
    """Off, the ack runs exactly the commands it runs with the option on but those of the
    records (their reads and SETs); and it writes none."""
    off = commands_of_an_ack(kept_queue(settings, redis_server), keyed=keyed)
    client = redis_server.client()
    assert client.keys("*ended*") == []
    client.flushall()
    queue = kept_queue(settings, redis_server, HISTORY_RETENTION=60)
    on = commands_of_an_ack(queue, keyed=keyed)
    records = {"set": 2 if keyed else 1, "hmget": 2}
    assert "set" not in off
    assert on == {name: off.get(name, 0) + records.get(name, 0) for name in on}
    assert set(off) <= set(on)


def test_a_foreign_typed_or_damaged_record_reads_as_damaged(
    settings: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    queue = kept_queue(settings, redis_server, HISTORY_RETENTION=60)
    client, tag = redis_store(queue).client, queue.store.keys.tag
    client.hset(f"{tag}:ended:foreign", "state", "acked")
    for name, value in {
        "cut": b"acked:17",
        "letters": b"acked:soon:1:0:",
        "unknown-state": b"eaten:1700000000000:1:0:",
        "worker-too-long": b"acked:1700000000000:1:99:w",
        "far-future": b"acked:9007199254740991:1:0:",
        "not-utf8": b"acked:1700000000000:1:2:\xff\xfek\xff",
    }.items():
        client.set(f"{tag}:ended:{name}", value)
    with caplog.at_level(logging.WARNING, "delayqueue_django.engine"):
        for message_id in ("foreign", "cut", "letters", "unknown-state", "worker-too-long"):
            found = queue.message(message_id)
            assert found is not None
            assert (found.id, found.state, found.ended_at) == (message_id, DAMAGED_OUTCOME, None)
        far = queue.message("far-future")
        assert far is not None
        assert far.state == DAMAGED_OUTCOME
        shown = queue.message("not-utf8")
        assert shown is not None
        assert (shown.state, shown.worker) == ("acked", "\\xff\\xfe")
    assert "holds another type than a string" in caplog.text
    # A key's index of another type names nothing.
    client.hset(f"{tag}:ended_key:k", "id", "x")
    assert queue.lookup("k") is None
    client.set(f"{tag}:ended_key:gone", "no-such-record")
    assert queue.lookup("gone") is None


def test_a_key_whose_message_ended_gives_no_cancel_hint(
    settings: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The DEBUG hint on a cancel by id that names a key says to pass key=: not for a key
    whose message ended (its outcome record), which no cancel could remove."""
    settings.DEBUG = True
    queue = kept_queue(settings, redis_server, HISTORY_RETENTION=60)
    queue.send("x", key="order-42-expiry", delay=60)
    assert queue.cancel(key="order-42-expiry")
    with caplog.at_level("WARNING", logger="delayqueue_django"):
        assert queue.cancel("order-42-expiry") is False
    assert caplog.records == []


def test_a_worker_acks_under_its_own_name(settings: Any, redis_server: RedisServer) -> None:
    """The worker's acks name it as its heartbeats do (``Worker.worker_id``): a message it
    handled says which worker that was."""
    queue = kept_queue(settings, redis_server, HISTORY_RETENTION=60)
    handled = queue.send({"n": 1}, key="order:7")
    worker = Worker([(queue, lambda message: None)], burst=True)
    worker.run()
    record = queue.lookup("order:7")
    assert record is not None
    assert (record.id, record.state, record.worker) == (handled, "acked", worker.worker_id)
    assert str(record.worker).count(":") >= 2  # host:pid:token
