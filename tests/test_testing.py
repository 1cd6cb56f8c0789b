"""delayqueue_django.testing: what users' own tests get. Nothing here waits or touches Redis."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from delayqueue_django import get_queue, send, signals
from delayqueue_django.core.message import Message
from delayqueue_django.testing import MemoryQueues, Verdict, memory_queues
from tests.redis_servers import RedisServer
from tests.test_doc_snippets import snippet

FOUND: list[bool] = []


def find_user(message: Message) -> None:
    FOUND.append(User.objects.filter(username=message.payload["user"]).exists())


def fail(message: Message) -> None:
    raise ConnectionError("the API is down")


@pytest.fixture
def queues(settings: Any) -> Iterator[MemoryQueues]:
    """As a user's conftest.py would offer it."""
    settings.DELAYQUEUES = {
        "default": {"REDIS": "redis", "HANDLER": "tests.worker_handlers.handle"},
        "api": {
            "REDIS": "redis",
            "HANDLER": "tests.test_testing.fail",
            "RETRY_COUNT": 2,
            "NACK_REDELIVERY_DELAY": [10, 20],
        },
    }
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        yield queues


@pytest.fixture
def signalled() -> Iterator[list[tuple[str, str, Any]]]:
    """(signal, message id, retry_at_ms or attempt) for every signal the helpers send."""
    seen: list[tuple[str, str, Any]] = []

    def acked(*, message: Message, **kwargs: Any) -> None:
        seen.append(("acked", message.id, message.attempt))

    def nacked(*, message: Message, retry_at_ms: Any, **kwargs: Any) -> None:
        seen.append(("nacked", message.id, retry_at_ms))

    def exhausted(*, message: Any, **kwargs: Any) -> None:
        seen.append(("exhausted", message.id, message.attempt))

    for signal, receiver in (
        (signals.message_acked, acked),
        (signals.message_nacked, nacked),
        (signals.message_exhausted, exhausted),
    ):
        signal.connect(receiver)
    yield seen
    for signal, receiver in (
        (signals.message_acked, acked),
        (signals.message_nacked, nacked),
        (signals.message_exhausted, exhausted),
    ):
        signal.disconnect(receiver)


def test_what_was_sent_is_captured_and_nothing_reaches_redis(
    queues: MemoryQueues, redis_server: RedisServer
) -> None:
    first = send({"order": 1}, delay=timedelta(minutes=30))
    second = send("to the api", queue="api", at=datetime(2030, 2, 1, tzinfo=UTC), retry_count=5)
    assert get_queue().cancel(first)

    [sent_first, sent_second] = queues.sent()
    assert (sent_first.id, sent_first.queue, sent_first.payload) == (first, "default", {"order": 1})
    assert sent_first.due_at == datetime(2030, 1, 1, 0, 30, tzinfo=UTC)
    assert sent_first.delay == timedelta(minutes=30)
    assert sent_first.retry_count == 3
    assert queues.sent("api") == [sent_second]
    assert (sent_second.id, sent_second.delay, sent_second.retry_count) == (
        second,
        timedelta(days=31),
        5,
    )
    assert redis_server.client().dbsize() == 0


def test_run_due_handles_what_is_due_once_the_clock_is_moved(
    queues: MemoryQueues, signalled: list[tuple[str, str, Any]]
) -> None:
    later = send({"n": 1}, delay=60)
    assert queues.run_due() == []
    queues.advance(59.999)
    assert queues.run_due() == []
    queues.advance(0.001)
    [outcome] = queues.run_due()
    assert (outcome.message.id, outcome.message.payload, outcome.verdict) == (
        later,
        {"n": 1},
        Verdict.ACK,
    )
    assert signalled == [("acked", later, 1)]
    assert get_queue().peek(later) is None
    assert queues.now == datetime(2030, 1, 1, 0, 1, tzinfo=UTC)


def test_failures_are_retried_on_the_backoff_and_then_exhausted(
    queues: MemoryQueues, signalled: list[tuple[str, str, Any]]
) -> None:
    message_id = send("call the api", queue="api")
    [first] = queues.run_due("api")
    assert (first.verdict, first.message.attempt) == (Verdict.NACK, 1)
    assert isinstance(first.error, ConnectionError)
    queues.advance(9)
    assert queues.run_due() == []
    queues.advance(1)
    [second] = queues.run_due()
    queues.advance(20)
    [third] = queues.run_due()
    assert [second.message.attempt, third.message.attempt] == [2, 3]

    start = 1_893_456_000_000  # 2030-01-01 in ms
    assert signalled == [
        ("nacked", message_id, start + 10_000),
        ("nacked", message_id, start + 30_000),
        ("nacked", message_id, None),
        ("exhausted", message_id, 3),
    ]
    [dead] = get_queue("api").list_messages("garbage")
    assert (dead.id, dead.unannounced) == (message_id, False)


def test_retries_due_at_once_are_handled_in_the_same_run(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": "memory://",
            "HANDLER": "tests.test_testing.fail",
            "RETRY_COUNT": 4,
            "NACK_REDELIVERY_DELAY": 0,
        }
    }
    with memory_queues() as queues:
        send("x")
        outcomes = queues.run_due()
    assert [o.message.attempt for o in outcomes] == [1, 2, 3, 4, 5]
    assert [o.verdict for o in outcomes] == [Verdict.NACK] * 5


@pytest.mark.django_db
def test_handlers_run_in_the_tests_own_transaction(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": "tests.test_testing.find_user"}
    }
    FOUND.clear()
    User.objects.create_user("ada")  # not committed: the test's transaction rolls it back
    with memory_queues() as queues:
        send({"user": "ada"})
        queues.run_due()
    assert FOUND == [True]
    assert User.objects.filter(username="ada").exists()  # the transaction is still usable


def test_the_settings_come_back_after_the_block(settings: Any) -> None:
    before = get_queue()
    with memory_queues() as queues:
        inside = get_queue()
        assert inside.config.memory_name is not None
        assert inside.config.retry_count == before.config.retry_count
        send("x")
    assert get_queue().config.url == before.config.url
    assert get_queue().stats()["pending"] == 0  # on Redis, nothing was sent there
    assert len(queues.sent()) == 1


def test_two_blocks_never_share_messages() -> None:
    with memory_queues():
        send("first block")
    with memory_queues() as queues:
        assert get_queue().stats()["pending"] == 0
        assert queues.sent() == []


def test_a_sharded_queue_is_sharded_in_memory_too(settings: Any) -> None:
    """SHARDS is kept: the test's queue spreads over memory shards as it would over Redis
    shards, and the helpers see, advance and run every one of them."""
    settings.DELAYQUEUES = {
        "default": {
            "URL": "redis://localhost/0",
            "HANDLER": "tests.worker_handlers.handle",
            "SHARDS": 4,
        }
    }
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        ids = get_queue().send_many([{"n": n} for n in range(20)], delay=60)
        assert {message.id for message in queues.sent("default")} == set(ids)
        assert len({message_id.partition("~")[2] for message_id in ids}) > 1  # many shards

        queues.advance(timedelta(seconds=60))
        outcomes = queues.run_due()

        assert sorted(outcome.message.id for outcome in outcomes) == sorted(ids)
        assert {outcome.verdict for outcome in outcomes} == {Verdict.ACK}
        assert get_queue().stats()["pending"] == 0


def schedule_every_second(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": "memory://",
            "HANDLER": "tests.worker_handlers.handle",
            "SCHEDULES": {"heartbeat": {"EVERY": 1, "PAYLOAD": {"do": "ok"}}},
        }
    }


def test_schedules_tick_only_when_asked(settings: Any) -> None:
    """A settings schedule adds nothing to what a test counts unless it asks for schedules:
    before, the first run_due() fired a tick on its own, so exact counts depended on the
    clock."""
    schedule_every_second(settings)
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        sent = send({"do": "ok"})
        handled = []
        for _ in range(3):
            handled += [outcome.message.id for outcome in queues.run_due()]
            queues.advance(1)
    assert handled == [sent]


def test_a_schedule_added_without_schedules_runs_only_the_tick_add_wrote(settings: Any) -> None:
    """As the testing guide says: without schedules=True, schedules.add() writes its first
    tick itself (as on Redis), which runs, and no later tick is ever written."""
    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": "tests.worker_handlers.handle"}
    }
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        get_queue().schedules.add("poll", every=1, payload={"do": "ok"})
        ticks = []
        for _ in range(5):
            queues.advance(1)
            ticks += [outcome.message.id for outcome in queues.run_due()]
    assert ticks == [f"tick:poll:{1_893_456_000_000 + 1000}"]


def test_schedules_tick_on_the_blocks_clock_when_asked(settings: Any) -> None:
    schedule_every_second(settings)
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC), schedules=True) as queues:
        ticks = []
        for _ in range(3):
            ticks += [outcome.message.id for outcome in queues.run_due()]
            queues.advance(1)
    # The first tick one period after the start, then one per second of the clock.
    assert ticks == [f"tick:heartbeat:{1_893_456_000_000 + 1000 * n}" for n in (1, 2)]


def test_schedules_tick_when_the_clock_is_moved_before_the_first_run_due(settings: Any) -> None:
    """The schedules run from the block's start, as a worker started then runs them: an
    hourly schedule ticks once an hour has passed, though nothing ran before. (They were
    stored at the first run_due(), at the moved clock: advance() before it wrote no tick.)"""
    settings.DELAYQUEUES = {
        "default": {
            "URL": "memory://",
            "HANDLER": "tests.worker_handlers.handle",
            "SCHEDULES": {"hourly": {"EVERY": 3600, "PAYLOAD": {"do": "ok"}}},
        }
    }
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC), schedules=True) as queues:
        queues.advance(timedelta(hours=1))
        ticks = [outcome.message.id for outcome in queues.run_due()]
    assert ticks == [f"tick:hourly:{1_893_456_000_000 + 3_600_000}"]


def test_the_guides_dead_letter_example_passes(settings: Any) -> None:
    """The testing guide's example of asserting that a message ended dead, run as written
    with the fixture its conftest.py offers."""
    settings.DELAYQUEUES = {
        "payments": {
            "URL": "memory://",
            "HANDLER": "tests.test_testing.fail",
            "RETRY_COUNT": 2,
        }
    }
    namespace: dict[str, Any] = {}
    exec(snippet("testing-dead-letter"), namespace)
    with memory_queues() as queues:
        namespace["test_a_card_that_is_always_declined_ends_dead"](queues)
