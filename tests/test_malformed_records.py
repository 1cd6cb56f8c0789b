"""Records anyone could write to a queue's keys, malformed in every way found so far: each one
costs its own message, never a fetch batch, an exhaustion claim, an admin page, the metrics
or the checks. Planted with raw commands on the tests' private Redis (single and cluster)."""

import json
import logging
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage, loggable, printable
from delayqueue_django.worker import heartbeat
from tests.helpers import fetch_when_due, states_of
from tests.redis_servers import RedisServer
from tests.test_worker import _worker_configurer, events, run_burst

# Fields past 2**53 - 1 are more than Lua's doubles hold exactly.
UNREADABLE_METAS: dict[str, str | bytes] = {
    "superscript-digit": "0:\N{SUPERSCRIPT TWO}:3:0",  # str.isdigit() says yes, int() no
    "lease-past-64-bits": "99999999999999999999:0:3:0",
    "lease-of-2-53": f"{2**53}:0:3:0",
    "due-past-2-53": f"0:0:3:{2**53}",
    "not-utf8": b"0:0:3:\xff",
}


def plant(queue: Queue, raw: Any, message_id: str | bytes, *, payload: Any, meta: Any) -> None:
    """A due pending message written past the scripts, as any client could write one."""
    key = queue.store.keys.key
    raw.zadd(key("pending"), {message_id: 0})
    raw.hset(key("payload"), message_id, payload)
    raw.hset(key("meta"), message_id, meta)


# The engine, message by message.


def test_a_payload_that_is_not_utf8_is_buried_alone_and_its_batch_handed_out(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = redis_queue
    good = queue.send_many(["one", "two", "three"])
    plant(queue, raw, "bad", payload=b'"\xff\xfe"', meta="0:0:3:0")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        fetched = queue.fetch(10, fetcher="f", request="1")
    assert sorted(m.id for m in fetched.messages) == sorted(good)
    assert states_of(queue, "bad") == ["garbage"]
    assert "undecodable payload, burying message id=bad" in caplog.text
    assert "not UTF-8 text" in caplog.text
    # The request's reply lost: its repeat hands out the good ones again, not an error.
    again = queue.fetch(10, fetcher="f", request="1")
    assert sorted(m.id for m in again.messages) == sorted(good)

    [claim] = queue.claim_exhausted()
    assert (claim.id, claim.payload) == ("bad", None)
    assert queue.confirm_exhausted([claim]) == 1
    [listed] = queue.list_messages("garbage")
    assert (listed.id, listed.payload, listed.payload_size) == ("bad", '"\\xff\\xfe"', 4)
    assert queue.peek("bad").payload == '"\\xff\\xfe"'  # type: ignore[union-attr]
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert report.damaged == 1


def test_the_checker_names_a_waiting_payload_that_is_not_utf8(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    queue.send("fine")
    plant(queue, raw, "bad", payload=b"\xc3(", meta="0:0:3:0")
    [problem] = queue.check_invariants().problems
    assert (problem.kind, problem.subject) == ("unreadable-payload", "bad")


def test_an_id_that_is_not_utf8_is_buried_announced_and_can_be_deleted(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = redis_queue
    good = queue.send("good")
    plant(queue, raw, b"id-\xff", payload='"x"', meta="0:0:3:0")
    [problem] = queue.check_invariants().problems
    assert (problem.kind, problem.subject) == ("unreadable-id", "id-\\xff")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        assert [m.id for m in fetch_when_due(queue)] == [good]
    assert "burying message id=id-\\xff" in caplog.text
    # Read back as surrogate escapes, an id goes back to Redis as the very same bytes.
    [dead] = queue.list_messages("garbage")
    assert printable(dead.id) == "id-\\xff"
    [claim] = queue.claim_exhausted()
    assert (claim.id, claim.payload) == (dead.id, "x")
    assert queue.confirm_exhausted([claim]) == 1
    report = queue.check_invariants()
    assert (report.ok, report.damaged) == (True, 1)
    assert queue.delete(dead.id) == "garbage"
    assert not raw.hexists(queue.store.keys.key("payload"), b"id-\xff")


@pytest.mark.parametrize("kind", UNREADABLE_METAS)
def test_a_meta_record_the_scripts_cannot_read_is_set_aside_and_never_rewritten(
    redis_queue: Queue, raw: Any, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    queue = redis_queue
    good = queue.send("good")
    plant(queue, raw, "bad", payload='"x"', meta=UNREADABLE_METAS[kind])

    peeked = queue.peek("bad")
    assert peeked is not None
    assert (peeked.state, peeked.lease, peeked.attempt) == ("pending", None, None)
    assert [m.id for m in queue.list_messages("pending")] == ["bad", good]  # due at 0
    [problem] = queue.check_invariants().problems
    assert (problem.kind, problem.subject) == ("bad-meta", "bad")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        assert [m.id for m in fetch_when_due(queue)] == [good]
    assert "subject=bad: meta record missing or unreadable" in caplog.text
    assert states_of(queue, "bad") == ["garbage"]
    meta = UNREADABLE_METAS[kind]
    planted = meta if isinstance(meta, bytes) else meta.encode()
    assert raw.hget(queue.store.keys.key("meta"), "bad") == planted
    report = queue.check_invariants()
    assert (report.ok, report.damaged) == (True, 1)


def test_the_largest_lease_lua_holds_exactly_still_works(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    plant(queue, raw, "old", payload='"x"', meta=f"{2**53 - 2}:0:3:0")
    [message] = fetch_when_due(queue)
    assert message.lease == 2**53 - 1
    assert queue.ack([message]) == {"old"}


def test_every_key_renamed_aside_is_kept_under_a_name_of_its_own(
    redis_queue: Queue, raw: Any
) -> None:
    queue = redis_queue
    key = queue.store.keys.key
    raw.set(key("quarantine"), "set aside by an older version")
    raw.set(key("retry"), "first")
    raw.set(key("exhausted"), "second")
    first = queue.send("one")
    queue.fetch(0)  # the first call that uses them renames them aside
    # A name already taken (a script in the same millisecond) is never written over: the
    # next rename finds the first one's name or one of these taken, and adds a suffix.
    now = queue.stats()["server_time_ms"]
    raw.mset({key(f"quarantine:retry:{ms}"): "taken" for ms in range(now + 1, now + 5000)})
    raw.set(key("retry"), "third")
    second = queue.send("two")
    queue.fetch(0)

    renamed = [name.decode() for name in raw.zrange(key("quarantine"), 0, -1)]
    held = {name: raw.get(name) for name in renamed}
    assert sorted(held.values()) == [
        b"first",
        b"second",
        b"set aside by an older version",
        b"third",
    ]
    by_value = {value: name for name, value in held.items()}
    assert by_value[b"set aside by an older version"].startswith(key("quarantine:quarantine:"))
    assert by_value[b"first"].startswith(key("quarantine:retry:"))
    assert by_value[b"second"].startswith(key("quarantine:exhausted:"))
    third = by_value[b"third"]
    assert third.startswith(key("quarantine:retry:"))
    assert third.endswith(":2")
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert sorted(report.quarantined) == sorted(renamed)
    assert [m.id for m in fetch_when_due(queue, count=10)] == [first, second]


# Monitoring: the admin, its JSON views, /metrics, delayqueue_stats.


def _admin(user_name: str = "root") -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser(user_name, password="pw"))
    return client


def _admin_paths(message_ids: list[str]) -> list[str]:
    def url(name: str, *args: str) -> str:
        return reverse(f"admin:delayqueue_django_queue_{name}", args=args)

    states = ("pending", "ready", "unack", "retry", "garbage")
    return [
        url("changelist"),
        url("json"),
        url("queue_json", "default"),
        *(url("detail", "default") + f"?state={state}" for state in states),
        *(url("message", "default", message_id) for message_id in message_ids),
        "/metrics/",
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("message_id", ["orders/17", "a/", "/x", "line\nbreak", "50%/?#"])
def test_a_message_id_with_a_slash_or_any_character_has_its_page(
    configure: Callable[..., Queue], message_id: str
) -> None:
    queue = configure()
    queue.store.send([NewMessage(id=message_id, payload='{"odd": "id"}', budget=3)])
    client = _admin()
    page = client.get(reverse("admin:delayqueue_django_queue_detail", args=["default"]))
    assert page.status_code == 200
    link = reverse("admin:delayqueue_django_queue_message", args=["default", message_id])
    assert f'href="{link}"' in page.content.decode()
    message_page = client.get(link)
    assert message_page.status_code == 200
    assert "&quot;odd&quot;: &quot;id&quot;" in message_page.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("details", ["[1, 2]", "not json", "null", b"\xff{"])
def test_a_heartbeat_that_is_no_json_object_is_skipped_with_a_warning(
    redis_queue: Queue, raw: Any, settings: Any, caplog: pytest.LogCaptureFixture, details: Any
) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = "token"
    queue = redis_queue
    key = queue.store.keys.key
    raw.sadd(key("workers"), "intruder")
    raw.set(key("worker:intruder"), details)
    heartbeat.beat(queue, "real", {"host": "h", "pid": 1}, ttl_seconds=60)

    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        assert [w["id"] for w in heartbeat.live_workers(queue)] == ["real"]
    assert "heartbeat of worker id=intruder queue=default is not a JSON object" in caplog.text
    client = _admin()
    for path in _admin_paths([]):
        assert client.get(path).status_code == 200, path
    metrics = Client().get("/metrics/", headers={"Authorization": "Bearer token"})
    assert 'delayqueue_workers{queue="default"} 1.0' in metrics.content.decode()
    out = StringIO()
    call_command("delayqueue_stats", "default", stdout=out)
    assert "h:1 (None handled" in out.getvalue()


# Log lines: an id from outside is written on one line, its control characters escaped.

# What an id would add to its log line to forge a record of its own after it.
FORGED = "\n2024-05-06 12:00:00,000 INFO delayqueue_django.admin: admin action=purge"


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        ("0190a1b2c3d4e5f6~1.2", "0190a1b2c3d4e5f6~1.2"),
        ("tick:nightly:1700000000000", "tick:nightly:1700000000000"),
        ("orders/17 é€😀", "orders/17 é€😀"),
        ("a\nb\r\tc", "a\\nb\\r\\tc"),
        ("\x1b[2J\x00\x7f", "\\x1b[2J\\x00\\x7f"),
        ("a\x85b\u2028c\u2029\u202e", "a\\x85b\\u2028c\\u2029\\u202e"),
        ("id-\udcff\n", "id-\\xff\\n"),  # bytes not UTF-8, read from Redis
    ],
)
def test_loggable_escapes_what_would_break_or_rewrite_a_line_and_keeps_the_rest(
    text: str, logged: str
) -> None:
    assert loggable(text) == logged


@pytest.mark.django_db
def test_an_id_with_a_line_break_cannot_forge_a_line_of_the_worker_log(
    redis_server: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = _worker_configurer(redis_server.url, settings)(RETRY_COUNT=0)
    kinds = {"ok": {}, "reject": {"do": "reject"}, "raise": {"do": "raise"}}
    queue.store.send(
        [NewMessage(f"{kind}{FORGED}", json.dumps(payload), 0) for kind, payload in kinds.items()]
    )
    with caplog.at_level(logging.DEBUG, logger="delayqueue_django"):
        run_burst(verbosity=2)

    assert sorted(e["id"] for e in events("start")) == sorted(f"{kind}{FORGED}" for kind in kinds)
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines if "\n" in line]
    escaped = loggable(FORGED)
    for expected in (
        f"handled message id=ok{escaped} queue=default attempt=1 verdict=ack",
        f"handler rejected message id=reject{escaped} queue=default attempt=1",
        f"handler failed message id=raise{escaped} queue=default attempt=1",
        f"message exhausted its retries id=raise{escaped} queue=default",
    ):
        assert [line for line in lines if line.startswith(expected)], expected


# Every kind at once, next to good messages, through a worker.


@pytest.mark.django_db
def test_malformed_records_next_to_good_messages_cost_only_themselves(
    redis_server: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = "token"
    queue = _worker_configurer(redis_server.url, settings)(RETRY_COUNT=3)
    raw = redis_server.client()
    key = queue.store.keys.key
    raw.set(key("retry"), "foreign")
    raw.set(key("exhausted"), "foreign")
    good = queue.send_many([{"n": n} for n in range(5)])
    queue.store.send([NewMessage(id="orders/17", payload='{"n": "slash"}', budget=3)])
    good.append("orders/17")
    plant(queue, raw, "payload-not-utf8", payload=b'{"n": "\xff"}', meta="0:0:3:0")
    plant(queue, raw, b"id-not-utf8-\xfe", payload='{"n": 1}', meta="0:0:3:0")
    for kind, meta in UNREADABLE_METAS.items():
        plant(queue, raw, f"meta-{kind}", payload='{"n": 1}', meta=meta)
    raw.sadd(key("workers"), "intruder")
    raw.set(key("worker:intruder"), "[1, 2]")

    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        run_burst()

    # The good ones handled once each; the bad ones never reached the handler.
    assert sorted(e["id"] for e in events("done")) == sorted(good)
    assert sorted(e["id"] for e in events("start")) == sorted(good)
    buried = ["payload-not-utf8", "id-not-utf8-\\xfe"]
    set_aside = [f"meta-{kind}" for kind in UNREADABLE_METAS]
    garbage = [printable(m.id) for m in queue.list_messages("garbage")]
    assert sorted(garbage) == sorted(buried + set_aside)
    stats = queue.stats()
    assert (stats["pending"], stats["unack"], stats["unannounced"]) == (0, 0, 0)
    # Each with a log line; the buried ones announced, with no payload where it is not text.
    for message_id in buried:
        assert f"undecodable payload, burying message id={message_id} " in caplog.text
    for message_id in set_aside:
        assert f"subject={message_id}: meta record missing or unreadable" in caplog.text
    announced = {printable(e["id"]): e["payload"] for e in events("exhausted")}
    assert announced == {"payload-not-utf8": None, "id-not-utf8-\\xfe": {"n": 1}}

    # No page fails: the admin, its JSON views, /metrics (the heartbeat is skipped, logged).
    client = _admin()
    for path in _admin_paths([buried[0], *set_aside]):  # (no URL holds bytes not UTF-8)
        assert client.get(path).status_code == 200, path
    assert "heartbeat of worker id=intruder" in caplog.text
    metrics = Client().get("/metrics/", headers={"Authorization": "Bearer token"})
    assert 'delayqueue_messages{queue="default",state="garbage"} 7.0' in metrics.content.decode()
    call_command("delayqueue_stats", stdout=StringIO())
    call_command("delayqueue_stats", json=True, stdout=StringIO())

    # The checker counts the damage set aside and names the keys renamed aside.
    out = StringIO()
    call_command("delayqueue_check", "default", stdout=out)
    report = out.getvalue()
    assert report.startswith("default: ok; ")
    assert "note: 7 dead letter(s) lack a readable payload or meta record" in report
    assert f"renamed aside to {key('quarantine:retry:')}" in report
    assert f"renamed aside to {key('quarantine:exhausted:')}" in report


def test_the_checker_fails_on_malformed_records_still_waiting(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    queue.send("good")
    plant(queue, raw, "payload-not-utf8", payload=b"\xff", meta="0:0:3:0")
    plant(queue, raw, b"id-\xfe", payload='"x"', meta="0:0:3:0")
    plant(queue, raw, "meta-superscript", payload='"x"', meta="0:\N{SUPERSCRIPT TWO}:3:0")
    out = StringIO()
    with pytest.raises(CommandError, match="problems found in default"):
        call_command("delayqueue_check", "default", stdout=out)
    lines = out.getvalue().splitlines()
    assert "  unreadable-payload: payload-not-utf8: pending with a payload not UTF-8" in lines
    assert "  unreadable-id: id-\\xfe: pending, id not UTF-8" in lines
    assert "  bad-meta: meta-superscript: unreadable meta '0:²:3:0'" in lines


@pytest.mark.django_db
def test_a_count_that_is_no_integer_starts_again_and_stops_nothing(
    redis_queue: Queue, raw: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = "token"
    queue = redis_queue
    key = queue.store.keys.key
    raw.hset(key("throughput"), "all:acked", "many")
    raw.hset(key("throughput"), b"all:\xff", "1.5")
    raw.hset(key("throughput"), "all:handler_duration:sum_us", "9" * 400)  # no float holds it
    minute = queue.stats()["server_time_ms"] // 60_000
    raw.hset(key("throughput"), f"{minute}:acked", "lots")
    raw.hset(key("throughput"), f"{minute}:failed", "lots")

    metrics = Client().get("/metrics/", headers={"Authorization": "Bearer token"})
    assert metrics.status_code == 200
    assert queue.throughput(1)[-1][1:] == (0, 0)
    first, second = queue.send_many(["one", "two"])
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
        delivered = fetch_when_due(queue, count=2)
        assert queue.ack([m for m in delivered if m.id == first]) == {first}
    assert "field all:acked could not count" in caplog.text
    assert states_of(queue, first) == []
    assert states_of(queue, second) == ["unack"]
    assert queue.stats()["acked_total"] == 1
    assert queue.throughput(1)[-1][1] == 1
    assert queue.store.totals()["acked"] == 1
    page = _admin().get(reverse("admin:delayqueue_django_queue_detail", args=["default"]))
    assert page.status_code == 200
