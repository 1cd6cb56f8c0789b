"""Attempt records in Redis itself (issue #35): what a plain ack costs, the bound after
10,000 refusals, HISTORY_REDACT keeping a secret out of every key, and damaged records."""

import uuid
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.history import ERROR_BYTES, TRACEBACK_BYTES, AttemptNote
from tests.helpers import redis_store
from tests.redis_servers import RedisServer

SECRET = f"s3cr3t-{uuid.uuid4().hex}"


def redact(message: Message, error: BaseException) -> BaseException:
    return type(error)(str(error).replace(SECRET, "***")).with_traceback(error.__traceback__)


def broken_redact(message: Message, error: BaseException) -> BaseException:
    raise RuntimeError(f"cannot: {error}")


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def private_queue(settings: Any, server: RedisServer, **options: Any) -> Queue:
    settings.DELAYQUEUES = {"default": {"URL": server.url, **options}}
    return get_queue()


def test_a_plain_ack_costs_no_command_more(settings: Any, redis_server: RedisServer) -> None:
    """A message that never failed: its ack deletes its payload and meta record, as before
    attempt records; one past its first attempt deletes its records as well."""
    queue = private_queue(settings, redis_server, RETRY_COUNT=3)
    client = redis_store(queue).client
    queue.send({"n": 1})
    [plain] = queue.fetch(1).messages
    client.config_resetstat()
    queue.ack([plain])
    stats = client.info("commandstats")
    assert stats["cmdstat_hdel"]["calls"] == 2
    assert "cmdstat_exists" not in stats

    queue.send({"n": 2})
    [failing] = queue.fetch(1).messages
    queue.nack([failing], delay=0)
    [again] = queue.fetch(1).messages
    assert not again.tracked
    assert client.hlen(f"{queue.store.keys.tag}:history") == 1
    client.config_resetstat()
    queue.ack([again])
    assert client.info("commandstats")["cmdstat_hdel"]["calls"] == 3
    assert not client.exists(f"{queue.store.keys.tag}:history")


def test_ten_thousand_refusals_keep_a_bounded_record(
    settings: Any, redis_server: RedisServer
) -> None:
    queue = private_queue(settings, redis_server)
    store, client = queue.store, redis_store(queue).client
    [message_id] = store.place([uuid.uuid4().hex])
    store.send([NewMessage(message_id, "{}", budget=1_000_000)])
    # The last refusals' notes at the bounds, for the bytes; the rest small, for the time
    # (a note at the bounds makes each nack rewrite 100 KB of records: 4 ms a cycle).
    small = AttemptNote("error", "builtins.ValueError", "x", "", "h:1", 5)
    large = AttemptNote(
        "error", "builtins.ValueError", "x" * ERROR_BYTES, "\n" * TRACEBACK_BYTES, "h:1", 5
    )
    for n in range(10_000):
        [delivery] = store.fetch(1).deliveries
        note = large if n >= 9_990 else small
        store.nack([(message_id, delivery.lease, 0)], attempts={message_id: note})
    records = queue.history(message_id)
    assert [r.attempt for r in records] == list(range(9_996, 10_001))
    # Each record's text at its bound, escaped ("\n" is two bytes in JSON), and a little more.
    size = client.hstrlen(f"{store.keys.tag}:history", message_id)
    assert size <= 5 * (ERROR_BYTES + 2 * TRACEBACK_BYTES + 100)


def every_value(client: Any) -> list[bytes]:
    """Every byte Redis holds under any key: names, members, fields and values."""
    found: list[bytes] = []
    for key in client.scan_iter(count=1000):
        found.append(key)
        kind = client.type(key).decode()
        if kind == "string":
            found.append(client.get(key))
        elif kind == "hash":
            for field, value in client.hgetall(key).items():
                found += [field, value]
        elif kind == "zset":
            found += client.zrange(key, 0, -1)
        elif kind == "list":
            found += client.lrange(key, 0, -1)
        elif kind == "set":
            found += list(client.smembers(key))
        else:
            raise AssertionError(f"a {kind} at {key!r}")
    return found


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("tests.test_history_redis.redact", "token ***"),
        ("tests.test_history_redis.broken_redact", "(redaction failed: builtins.RuntimeError)"),
    ],
)
def test_history_redact_keeps_a_secret_out_of_redis(
    settings: Any, redis_server: RedisServer, path: str, shown: str
) -> None:
    queue = private_queue(settings, redis_server, HISTORY_REDACT=path)
    client = redis_store(queue).client
    queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    error = raised(PermissionError(f"token {SECRET}"))
    queue.nack([message], delay=60, attempts={message.id: queue.attempt_note(message, error)})
    [record] = queue.history(message.id)
    assert record.error_class == "builtins.PermissionError"
    assert record.error == shown
    assert SECRET not in record.traceback
    assert all(SECRET.encode() not in value for value in every_value(client))


@pytest.mark.parametrize(
    ("raw", "damage"),
    [
        (b"\xff\xfe", "unreadable"),
        (b"not json", "unreadable"),
        (b'{"a": 1}', "not a list"),
        (b"[1]", "not an attempt record"),
        (b'[[1, "error"]]', "missing fields"),
        (b'[[1, "error", 3, "", "", "", "soon", 5, ""]]', "not text"),
        ('[[2, "error", "", "caf\u00e9", "", "", null, 5, ""]]'.encode("latin-1"), "UTF-8"),
    ],
)
def test_a_damaged_record_reads_as_damaged_and_a_refusal_replaces_it(
    settings: Any, redis_server: RedisServer, raw: bytes, damage: str
) -> None:
    queue = private_queue(settings, redis_server)
    client = redis_store(queue).client
    message_id = queue.send({"n": 1})
    client.hset(f"{queue.store.keys.tag}:history", message_id, raw)
    [read] = queue.history(message_id)
    assert damage in read.damaged
    assert queue.last_errors([message_id]) == {message_id: read}
    [message] = queue.fetch(1).messages
    queue.nack([message], delay=60)
    assert [(r.attempt, r.verdict, r.damaged) for r in queue.history(message_id)][-1] == (
        1,
        "nack",
        "",
    )


def test_a_history_key_of_another_type_is_set_aside(
    settings: Any, redis_server: RedisServer
) -> None:
    queue = private_queue(settings, redis_server)
    client = redis_store(queue).client
    key = f"{queue.store.keys.tag}:history"
    client.set(key, "someone else's")
    message_id = queue.send({"n": 1})
    [read] = queue.history(message_id)
    assert read.damaged == "the history key holds a string, not a hash"
    assert queue.last_errors([message_id]) == {message_id: read}
    [message] = queue.fetch(1).messages
    queue.nack([message], delay=60)
    assert [r.verdict for r in queue.history(message_id)] == ["nack"]
    assert client.type(key) == b"hash"


def test_the_invariants_report_records_left_behind(
    settings: Any, redis_server: RedisServer
) -> None:
    queue = private_queue(settings, redis_server)
    client = redis_store(queue).client
    message_id = queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    queue.nack([message], delay=0)
    assert queue.check_invariants().ok
    [again] = queue.fetch(1).messages
    queue.ack([again])
    assert queue.check_invariants().ok
    client.hset(f"{queue.store.keys.tag}:history", "gone", "[]")
    [problem] = queue.check_invariants().problems
    assert (problem.kind, problem.subject) == ("orphan-history", "gone")
    assert message_id != "gone"
