"""The public API: send, cancel, get_queue; bad input raises and writes nothing."""

import decimal
import re
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import override_settings

import delayqueue_django as delayqueue
from delayqueue_django.core import registry
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.store import base as store_module
from delayqueue_django.exceptions import (
    DelayQueueError,
    DuplicateMessageId,
    InvalidDelay,
    InvalidRetryCount,
    PayloadEncodingError,
    PayloadTooLarge,
    QueueConfigurationError,
    UnknownQueue,
    UnsupportedRedisVersion,
)
from tests.helpers import fetch_when_due, redis_store
from tests.redis_servers import RedisServer


@pytest.fixture
def nothing_written(redis_server: RedisServer) -> Any:
    yield
    assert redis_server.client().dbsize() == 0


def test_send_and_cancel_through_the_module(redis_server: RedisServer) -> None:
    message_id = delayqueue.send({"order": 1}, delay=timedelta(minutes=5))
    assert isinstance(message_id, str)
    assert len(message_id) == 14
    assert delayqueue.get_queue().stats()["pending"] == 1
    assert delayqueue.cancel(message_id) is True
    assert delayqueue.cancel(message_id) is False
    # Nothing of the message is left; the metrics history keeps that it was sent.
    left = redis_server.client().keys()
    assert [name for name in left if b":metrics:m:" not in name] == []


def test_single_sends_give_each_message_an_id_of_its_own(redis_server: RedisServer) -> None:
    # (A plain send() makes its one id its own way: see QueueProducing._plain_message.)
    ids = [delayqueue.send(n, delay=60) for n in range(200)]
    assert len(set(ids)) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{14}", message_id) for message_id in ids)
    pending = delayqueue.get_queue().list_messages("pending", limit=1000)
    assert sorted(entry.id for entry in pending) == sorted(ids)


def test_a_bulk_send_gives_each_message_an_id_of_its_own(redis_server: RedisServer) -> None:
    queue = delayqueue.get_queue()
    ids = queue.send_many(list(range(500)), delay=60)
    assert len(set(ids)) == 500
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{14}", message_id) for message_id in ids)
    assert sorted(entry.id for entry in queue.list_messages("pending", limit=1000)) == sorted(ids)
    assert queue.send_many([]) == []


def test_send_to_a_named_queue_with_a_retry_count() -> None:
    message_id = delayqueue.send("x", queue="other", retry_count=7)
    [entry] = delayqueue.get_queue("other").list_messages("pending")
    assert (entry.id, entry.budget) == (message_id, 7)
    assert delayqueue.get_queue("default").stats()["pending"] == 0
    assert delayqueue.cancel(message_id, queue="default") is False
    assert delayqueue.cancel(message_id, queue="other") is True


@pytest.mark.parametrize("asynchronous", [False, True], ids=["send_many", "asend_many"])
def test_the_module_sends_many_as_the_queue_does(asynchronous: bool) -> None:
    """As send is: the module's send_many names its queue, else "default"."""
    items: list[Any] = ["a", delayqueue.Outgoing("b", key="order-1", delay=60, retry_count=2)]
    if asynchronous:
        ids = async_to_sync(delayqueue.asend_many)(items, delay=60, queue="other", retry_count=7)
    else:
        ids = delayqueue.send_many(items, delay=60, queue="other", retry_count=7)
    pending = delayqueue.get_queue("other").list_messages("pending")
    listed = {entry.id: entry.budget for entry in pending}
    assert listed == {ids[0]: 7, ids[1]: 2}
    found = delayqueue.get_queue("other").lookup("order-1")
    assert found is not None
    assert found.id == ids[1]
    assert delayqueue.get_queue("default").stats()["pending"] == 0
    assert delayqueue.send_many([]) == []


@pytest.mark.parametrize("option", ["key", "if_exists", "unique_for", "group"])
def test_send_many_says_a_key_or_group_goes_on_each_item(option: str) -> None:
    """Before, send_many(key=...) was Python's bare "unexpected keyword argument"."""
    calls: list[tuple[str, Callable[..., Any]]] = [
        ("send_many", delayqueue.get_queue().send_many),
        ("send_many", delayqueue.send_many),
        ("asend_many", async_to_sync(delayqueue.get_queue().asend_many)),
        ("asend_many", async_to_sync(delayqueue.asend_many)),
    ]
    for name, call in calls:
        with pytest.raises(TypeError) as raised:
            call(["a", "b"], **{option: "x"})
        assert str(raised.value) == (
            f"{name}() takes {option} per message, not for the call: give each message as "
            f"Outgoing(payload, {option}=...) (from delayqueue_django import Outgoing)"
        )
    assert delayqueue.get_queue().stats()["pending"] == 0


def test_send_many_refuses_an_unknown_option_as_python_would() -> None:
    unexpected = "send_many\\(\\) got an unexpected keyword argument 'delai'"
    with pytest.raises(TypeError, match=unexpected):
        delayqueue.send_many(["a"], delai=60)  # type: ignore[arg-type]


def repeated_run(text: str, words: int) -> str | None:
    """The first run of ``words`` words that ``text`` holds twice (not overlapping)."""
    found = re.findall(r"\S+", text)
    first_at: dict[tuple[str, ...], int] = {}
    for at in range(len(found) - words + 1):
        run = tuple(found[at : at + words])
        if at - first_at.setdefault(run, at) >= words:
            return " ".join(run)
    return None


@pytest.mark.parametrize(
    "name", [name for name in delayqueue.__all__ if name[0].islower() and name != "handler"]
)
def test_the_module_functions_docstrings_say_nothing_twice(name: str) -> None:
    """send's said that the outbox's relay moves a row to Redis "once it committed" twice
    (a sentence pasted over)."""
    doc = getattr(delayqueue, name).__doc__
    assert doc
    assert repeated_run(doc, 8) is None


OTHER_QUEUE_HINT = (
    "cancel({id!r}) looked on queue 'default' only, which does not hold it; queue 'other' "
    "does (pending). An id does not name its queue: pass queue='other'. (Checked because "
    "DEBUG is on.)"
)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["cancel", "acancel"])
def test_a_cancel_on_the_wrong_queue_says_which_holds_it_under_debug(
    asynchronous: bool, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, cancel(id) of another queue's message answered False and said nothing, as
    for a message already handled."""
    settings.DEBUG = True
    message_id = delayqueue.send("x", queue="other", delay=60)
    with caplog.at_level("WARNING", logger="delayqueue_django"):
        if asynchronous:
            cancelled = async_to_sync(delayqueue.acancel)(message_id)
        else:
            cancelled = delayqueue.cancel(message_id)
    assert cancelled is False
    assert [record.getMessage() for record in caplog.records] == [
        OTHER_QUEUE_HINT.format(id=message_id)
    ]
    assert delayqueue.cancel(message_id, queue="other") is True


KEY_AS_ID_HINT = (
    "cancel('order-42-expiry') looked for a message with that id on queue 'default', and "
    "there is none; 'order-42-expiry' is the key of a message there ({state}): pass "
    "key='order-42-expiry'. (Checked because DEBUG is on.)"
)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["cancel", "acancel"])
def test_a_key_given_as_the_id_says_to_pass_key_under_debug(
    asynchronous: bool, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, cancel("a-key") answered False and said nothing, as for a message already
    handled."""
    settings.DEBUG = True
    delayqueue.send("x", key="order-42-expiry", delay=60)
    with caplog.at_level("WARNING", logger="delayqueue_django"):
        if asynchronous:
            cancelled = async_to_sync(delayqueue.acancel)("order-42-expiry")
        else:
            cancelled = delayqueue.cancel("order-42-expiry")
    assert cancelled is False
    assert [record.getMessage() for record in caplog.records] == [
        KEY_AS_ID_HINT.format(state="pending")
    ]
    assert delayqueue.cancel(key="order-42-expiry") is True


def test_a_cancel_that_finds_nothing_anywhere_says_nothing(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DEBUG = True
    message_id = delayqueue.send("x", queue="other", delay=60)
    with caplog.at_level("WARNING", logger="delayqueue_django"):
        assert delayqueue.cancel(message_id, queue="other") is True
        assert delayqueue.cancel(message_id) is False
        assert delayqueue.cancel("nothing-here") is False
    assert caplog.records == []


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_only_debug_looks_at_the_other_queues_on_a_miss(debug: bool, settings: Any) -> None:
    """With DEBUG off (production), a miss costs no look at a key of that name nor at the
    other queues: no read-only Function call (a lookup, a peek) reaches their Redis, here
    the test's, which both queues share."""
    settings.DEBUG = debug
    message_id = delayqueue.send("x", queue="other", delay=60)
    client = redis_store(delayqueue.get_queue("other")).client

    def peeks() -> int:
        return int(client.info("commandstats").get("cmdstat_fcall_ro", {}).get("calls", 0))

    before = peeks()
    assert delayqueue.cancel(message_id) is False
    # Under DEBUG: the id looked up as a key of "default", then as an id on "other".
    assert peeks() - before == (2 if debug else 0)


def test_payloads_use_djangos_json_encoder() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    delayqueue.send({"when": when, "price": decimal.Decimal("9.99"), "key": key, "é": "ü"})
    [message] = fetch_when_due(delayqueue.get_queue())
    assert message.payload == {
        "when": "2030-01-02T03:04:05Z",
        "price": "9.99",
        "key": "12345678-1234-5678-1234-567812345678",
        "é": "ü",
    }


@pytest.mark.parametrize(
    ("payload", "error", "words"),
    [
        ({1, 2}, PayloadEncodingError, "Object of type set is not JSON serializable"),
        (object(), PayloadEncodingError, "Object of type object"),
        (float("nan"), PayloadEncodingError, "Out of range float values"),
        ({"x": float("inf")}, PayloadEncodingError, "Out of range float values"),
        ("\ud800", PayloadEncodingError, "lone surrogate"),
    ],
)
def test_payloads_json_cannot_carry_are_refused(
    nothing_written: None, payload: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        delayqueue.send(payload)


def test_a_payload_nested_too_deeply_is_refused(nothing_written: None) -> None:
    payload: list[Any] = []
    for _ in range(100_000):
        payload = [payload]
    with pytest.raises(PayloadEncodingError, match="nested too deeply"):
        delayqueue.send(payload)


def test_a_circular_payload_is_refused(nothing_written: None) -> None:
    payload: dict[str, Any] = {}
    payload["self"] = payload
    with pytest.raises(PayloadEncodingError, match="Circular reference"):
        delayqueue.send(payload)


def _deep(inner: Any, depth: int) -> Any:
    for level in range(depth):
        inner = [inner] if level % 2 else {"level": inner}
    return inner


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({1: "a", "1": "b"}, "has keys 1 and '1' in one object; JSON writes both as '1'"),
        ({"true": 1, True: 2}, "has keys 'true' and True in one object"),
        ({False: 0, "false": 1}, "has keys False and 'false'"),
        ({None: 1, "null": 2}, "has keys None and 'null'"),
        ({1.5: "a", "1.5": "b"}, "has keys 1.5 and '1.5'"),
        ({-7: "a", "-7": "b"}, "has keys -7 and '-7'"),
        ({1e16: "a", "1e+16": "b"}, "has keys 1e+16 and '1e+16'"),
        ({"order": [{"lines": ({2: "x", "2": "y"},)}]}, "has keys 2 and '2'"),
        (_deep({3: "x", "3": "y"}, 500), "has keys 3 and '3'"),
    ],
)
def test_a_payload_whose_keys_collide_in_json_is_refused(
    nothing_written: None, payload: Any, words: str
) -> None:
    # JSON keys are text: written as it is, one of the two keys would vanish on the way.
    with pytest.raises(PayloadEncodingError, match=re.escape(words)):
        delayqueue.send(payload)


def test_keys_that_stay_distinct_in_json_are_accepted() -> None:
    payload = {5: "int", "2": "str", True: "bool", None: "none", 1.5: "float", "x": {3: "y"}}
    delayqueue.send(payload)
    [message] = fetch_when_due(delayqueue.get_queue())
    assert message.payload == {
        "5": "int",
        "2": "str",
        "true": "bool",
        "null": "none",
        "1.5": "float",
        "x": {"3": "y"},
    }


def test_one_payload_with_colliding_keys_refuses_its_whole_bulk_send(
    nothing_written: None,
) -> None:
    good = [{"n": n} for n in range(10)]
    with pytest.raises(PayloadEncodingError, match="has keys 1 and '1'"):
        delayqueue.get_queue().send_many([*good, {1: "a", "1": "b"}, *good])
    with pytest.raises(PayloadEncodingError, match="has keys None and 'null'"):
        delayqueue.get_queue().send_many([*good, delayqueue.Outgoing({None: 1, "null": 2})])


def test_encoding_errors_are_type_errors() -> None:
    assert issubclass(PayloadEncodingError, TypeError)
    assert issubclass(PayloadEncodingError, DelayQueueError)


@pytest.fixture
def small_payload_limit(settings: Any, redis_server: RedisServer) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "MAX_PAYLOAD_BYTES": 100}}


def test_a_payload_over_the_size_limit_is_refused(
    small_payload_limit: None, nothing_written: None
) -> None:
    with pytest.raises(PayloadTooLarge, match="is 101 bytes encoded; MAX_PAYLOAD_BYTES is 100"):
        delayqueue.send("x" * 99)  # 99 characters and two quotes
    assert issubclass(PayloadTooLarge, ValueError)


def test_a_payload_at_the_size_limit_is_accepted(small_payload_limit: None) -> None:
    delayqueue.send("x" * 98)
    assert delayqueue.get_queue().stats()["pending"] == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"delay": -1}, "must not be negative"),
        ({"delay": timedelta(seconds=-1)}, "must not be negative"),
        ({"delay": "5"}, "delay must be a number of seconds or a timedelta, not str"),
        ({"delay": True}, "not bool"),
        ({"delay": float("nan")}, "finite"),
        ({"delay": float("inf")}, "finite"),
        ({"delay": 1e300}, "too far in the future"),
        ({"delay": 1, "at": datetime.now(UTC)}, "either delay or at, not both"),
        ({"at": datetime(2030, 1, 1)}, "naive datetime while USE_TZ is True"),
        ({"at": date(2030, 1, 1)}, "at must be a datetime, not date"),
        ({"at": "2030-01-01"}, "at must be a datetime, not str"),
    ],
)
def test_bad_timing_is_refused(nothing_written: None, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidDelay, match=words):
        delayqueue.send("x", **kwargs)


def test_invalid_delay_is_a_value_error() -> None:
    assert issubclass(InvalidDelay, ValueError)


@pytest.mark.parametrize("retry_count", [-1, 1001, "3", 2.5, True])
def test_bad_retry_count_is_refused(nothing_written: None, retry_count: Any) -> None:
    with pytest.raises(InvalidRetryCount, match="retry_count must be an int from 0 to 1000"):
        delayqueue.send("x", retry_count=retry_count)


def test_a_naive_datetime_is_local_time_when_use_tz_is_off(settings: Any) -> None:
    settings.USE_TZ = False
    settings.TIME_ZONE = "Europe/Paris"
    delayqueue.send("x", at=datetime(2030, 7, 1, 12, 0))
    [entry] = delayqueue.get_queue().list_messages("pending")
    assert entry.score_ms == int(datetime(2030, 7, 1, 10, 0, tzinfo=UTC).timestamp() * 1000)


def test_an_unknown_queue_names_the_configured_ones(nothing_written: None) -> None:
    with pytest.raises(UnknownQueue) as caught:
        delayqueue.send("x", queue="emails")
    assert str(caught.value) == (
        "no queue named 'emails' in DELAYQUEUES; configured: 'default', 'other'"
    )
    assert isinstance(caught.value, LookupError)


def test_cancel_needs_a_string_id() -> None:
    with pytest.raises(TypeError, match="message id must be a non-empty str"):
        delayqueue.cancel(123)  # type: ignore[arg-type]


def test_a_duplicate_id_is_refused_and_the_batch_not_written(queue: Queue) -> None:
    queue.store.send([NewMessage(id="same", payload='"a"', budget=3)])
    with pytest.raises(DuplicateMessageId, match="'same' already exists in queue 'default'"):
        queue.store.send(
            [NewMessage(id="fresh", payload='"b"', budget=3), NewMessage("same", '"c"', 3)]
        )
    assert queue.peek("fresh") is None
    stored = queue.peek("same")
    assert stored is not None
    assert stored.payload == '"a"'


def test_a_duplicate_of_a_message_in_any_state_is_refused(queue: Queue) -> None:
    in_flight, dead = queue.send("in flight"), queue.send("dead", retry_count=0)
    fetched = {m.id: m for m in fetch_when_due(queue, count=2)}
    queue.nack([fetched[dead]])
    for message_id in (in_flight, dead):
        with pytest.raises(DuplicateMessageId):
            queue.store.send([NewMessage(id=message_id, payload='"again"', budget=3)])
    assert queue.ack([fetched[in_flight]]) == {in_flight}


def test_changed_settings_take_effect_at_once(settings: Any) -> None:
    delayqueue.send("x")
    assert delayqueue.get_queue().config.retry_count == 3
    settings.DELAYQUEUES = {
        "default": {**settings.DELAYQUEUES["default"], "RETRY_COUNT": 9},
    }
    assert delayqueue.get_queue().config.retry_count == 9
    with pytest.raises(UnknownQueue):
        delayqueue.get_queue("other")


def test_invalid_settings_raise_improperly_configured_on_use(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "http://example.com", "RETRY_COUNT": -1}}
    with pytest.raises(QueueConfigurationError) as caught:
        delayqueue.send("x")
    message = str(caught.value)
    assert "delayqueue_django.E007" in message
    assert "delayqueue_django.E009" in message
    from django.core.exceptions import ImproperlyConfigured

    assert isinstance(caught.value, ImproperlyConfigured)


def test_sending_without_the_app_installed_says_to_add_it(
    settings: Any, nothing_written: None
) -> None:
    installed = [app for app in settings.INSTALLED_APPS if app != "delayqueue_django"]
    with override_settings(INSTALLED_APPS=installed):
        registry.reset()  # as a process that never had the app starts: no queue built yet
        for call in (lambda: delayqueue.send("x"), lambda: delayqueue.get_queue("other")):
            with pytest.raises(QueueConfigurationError) as caught:
                call()
            assert str(caught.value) == (
                'delayqueue_django is not in INSTALLED_APPS: add "delayqueue_django" to '
                "INSTALLED_APPS in your settings (the worker command run_delayqueue, the system "
                "checks and the admin pages come with it)."
            )
    assert delayqueue.get_queue().name == "default"  # installed again: queues are built


def test_a_django_redis_cache_alias_shares_the_caches_connection_pool(settings: Any) -> None:
    from django_redis import get_redis_connection

    settings.DELAYQUEUES = {"default": {"REDIS": "redis"}}
    queue = delayqueue.get_queue()
    assert redis_store(queue).client is get_redis_connection("redis")
    message_id = delayqueue.send("through the cache's pool")
    [message] = fetch_when_due(queue)
    assert message.id == message_id


def test_a_client_that_decodes_responses_works_too(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "OPTIONS": {"decode_responses": True}}
    }
    queue = delayqueue.get_queue()
    message_id = queue.send({"text": "ünïcode"})
    [message] = fetch_when_due(queue)
    assert (message.id, message.payload) == (message_id, {"text": "ünïcode"})
    assert queue.ack([message]) == {message_id}
    assert queue.list_messages("pending") == []


def test_a_redis_older_than_the_minimum_is_refused_clearly(
    nothing_written: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MINIMUM_REDIS_VERSION", (99, 0))
    with pytest.raises(UnsupportedRedisVersion) as caught:
        delayqueue.send("x")
    assert "delayqueue_django needs Redis 99.0 or newer; queue 'default' is on Redis 7." in str(
        caught.value
    )


@pytest.mark.parametrize("command", ["run_delayqueue", "delayqueue_check", "delayqueue_stats"])
def test_the_commands_refuse_a_redis_older_than_the_minimum_at_once(
    command: str, redis_server: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "HANDLER": "tests.worker_handlers.handle"}
    }
    monkeypatch.setattr(store_module, "MINIMUM_REDIS_VERSION", (99, 0))
    options = {"burst": True} if command == "run_delayqueue" else {}
    with pytest.raises(CommandError, match=r"needs Redis 99\.0 or newer; queue 'default' is on"):
        call_command(command, stdout=StringIO(), stderr=StringIO(), **options)


def test_the_redis_server_version_is_read_once_per_queue(redis_server: RedisServer) -> None:
    queue = delayqueue.get_queue()
    queue.stats()
    before = redis_server.client().info("commandstats").get("cmdstat_info", {}).get("calls", 0)
    queue.stats()
    queue.send("x")
    after = redis_server.client().info("commandstats").get("cmdstat_info", {}).get("calls", 0)
    assert after == before + 1  # only the line above itself


def test_a_queue_held_across_a_settings_change_keeps_working(settings: Any) -> None:
    held = delayqueue.get_queue()
    settings.DELAYQUEUES = {**settings.DELAYQUEUES, "extra": settings.DELAYQUEUES["default"]}
    assert delayqueue.get_queue() is not held
    held.send("still usable")
    assert held.stats()["pending"] == 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["send", "asend"])
def test_send_of_an_outgoing_keeps_its_own_options(
    configure: Callable[..., Queue], asynchronous: bool
) -> None:
    # An Outgoing given to send() keeps its own timing and key, as in send_many (the plain
    # send's short way of #34 took it for a payload and failed to encode it).
    queue = configure()
    outgoing = delayqueue.Outgoing("x", delay=60, key="k")
    message_id = async_to_sync(queue.asend)(outgoing) if asynchronous else queue.send(outgoing)
    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.payload, stored.key) == ('"x"', "k")
