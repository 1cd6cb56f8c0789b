"""Expiry, Postpone and Retry around the engine: the settings' checks, the exceptions, a
handler raising Postpone or Retry (in the test's thread, as the worker runs it), the signals,
the Tasks backend, Prometheus, and a plain queue's Redis untouched by any of it."""

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from delayqueue_django import Postpone, Retry, get_queue, signals
from delayqueue_django.checks import check_delayqueues
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import EXPIRED, POSTPONED_TOO_OFTEN
from delayqueue_django.exceptions import InvalidDelay
from delayqueue_django.tasks.compat import TaskResultStatus
from delayqueue_django.testing import MemoryQueues, Verdict, memory_queues
from tests.helpers import redis_store
from tests.redis_servers import RedisServer
from tests.task_app import expiry_tasks

BACKEND = "delayqueue_django.tasks.DelayQueueBackend"


def ok(message: Message) -> None:
    pass


def always_postpone(message: Message) -> None:
    raise Postpone(1)


def retry_in_an_hour(message: Message) -> None:
    raise Retry(3600, "the partner said Retry-After: 3600")


def retry_as_the_queue_says(message: Message) -> None:
    raise Retry(reason="the partner is down")


def retry_in_a_second(message: Message) -> None:
    raise Retry(1)


@pytest.fixture
def queues(settings: Any) -> Iterator[MemoryQueues]:
    settings.DELAYQUEUES = {
        "default": {"REDIS": "redis", "HANDLER": "tests.test_expiry_api.always_postpone"},
        "bounded": {
            "REDIS": "redis",
            "HANDLER": "tests.test_expiry_api.always_postpone",
            "MAX_POSTPONES": 3,
        },
        "retrying": {
            "REDIS": "redis",
            "HANDLER": "tests.test_expiry_api.retry_in_an_hour",
            "RETRY_COUNT": 1,
        },
        "expiring": {"REDIS": "redis", "HANDLER": "tests.test_expiry_api.ok", "EXPIRES": 60},
        "partner": {
            "REDIS": "redis",
            "HANDLER": "tests.test_expiry_api.retry_as_the_queue_says",
            "RETRY_COUNT": 1,
            "NACK_REDELIVERY_DELAY": 5,
        },
        "soon": {"REDIS": "redis", "HANDLER": "tests.test_expiry_api.retry_in_a_second"},
    }
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        yield queues


@pytest.fixture
def announced() -> Iterator[list[tuple[str, str, str]]]:
    """(signal, id, reason) of every expiry and exhaustion announced."""
    log: list[tuple[str, str, str]] = []

    def on_expired(message: Any, **kwargs: Any) -> None:
        log.append(("expired", message.id, message.reason))

    def on_exhausted(message: Any, **kwargs: Any) -> None:
        log.append(("exhausted", message.id, message.reason))

    signals.message_expired.connect(on_expired, weak=False)
    signals.message_exhausted.connect(on_exhausted, weak=False)
    yield log
    signals.message_expired.disconnect(on_expired)
    signals.message_exhausted.disconnect(on_exhausted)


# Settings


def test_bad_expiry_and_postpone_options_are_check_errors(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "a": {"REDIS": "redis", "EXPIRES": "an hour"},
        "b": {"REDIS": "redis", "EXPIRES": 0},
        "c": {"REDIS": "redis", "MAX_POSTPONES": -1},
        "d": {"REDIS": "redis", "MAX_POSTPONES": 1.5},
        "fine": {"REDIS": "redis", "EXPIRES": timedelta(hours=1), "MAX_POSTPONES": 0},
    }
    found = [(error.id, error.msg) for error in check_delayqueues()]
    assert found == [
        (
            "delayqueue_django.E060",
            "DELAYQUEUES['a']['EXPIRES'] must be a positive number of seconds, a timedelta, "
            "or None for messages that never expire; not 'an hour'.",
        ),
        (
            "delayqueue_django.E060",
            "DELAYQUEUES['b']['EXPIRES'] must be a positive number of seconds, a timedelta, "
            "or None for messages that never expire; not 0.",
        ),
        (
            "delayqueue_django.E061",
            "DELAYQUEUES['c']['MAX_POSTPONES'] must be an int from 0 to 1000000, not -1.",
        ),
        (
            "delayqueue_django.E061",
            "DELAYQUEUES['d']['MAX_POSTPONES'] must be an int from 0 to 1000000, not 1.5.",
        ),
    ]


def test_the_verdicts_take_seconds_or_a_timedelta() -> None:
    assert Postpone(timedelta(seconds=1.5)).delay_ms == 1500
    assert Postpone(0).delay_ms == 0
    assert Retry(0.0001).delay_ms == 1  # rounded up: never earlier than asked
    for verdict in (Postpone, Retry):
        bad: Any
        for bad in (-1, "soon", float("inf"), True, timedelta(days=400)):
            with pytest.raises(InvalidDelay):
                verdict(bad)


# Handlers


def test_a_handler_raising_postpone_gets_it_back_later_without_an_attempt(
    queues: MemoryQueues,
) -> None:
    queue = get_queue("default")
    message_id = queue.send({"n": 1}, retry_count=0)
    [outcome] = queues.run_due()
    assert (outcome.verdict, outcome.postponed, outcome.delay_ms) == (Verdict.NACK, True, 1000)
    assert queues.run_due() == []  # not due yet
    queues.advance(1)
    [again] = queues.run_due()
    assert (again.message.id, again.message.attempt) == (message_id, 1)
    stats = queue.stats()
    assert (stats["postponed_total"], stats["failed_total"], stats["garbage"]) == (2, 0, 0)


def test_postponing_past_max_postpones_dead_letters_with_its_reason(
    queues: MemoryQueues, announced: list[Any]
) -> None:
    queue = get_queue("bounded")
    message_id = queue.send({"n": 1})
    for _ in range(4):
        queues.run_due("bounded")
        queues.advance(1)
    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.state, stored.dead_reason, stored.attempt) == (
        "garbage",
        POSTPONED_TOO_OFTEN,
        0,
    )
    assert announced == [("exhausted", message_id, POSTPONED_TOO_OFTEN)]


def test_a_handler_raising_retry_uses_an_attempt_after_its_own_delay(
    queues: MemoryQueues, announced: list[Any]
) -> None:
    queue = get_queue("retrying")
    message_id = queue.send({"n": 1})
    [outcome] = queues.run_due("retrying")
    assert (outcome.verdict, outcome.postponed, outcome.delay_ms) == (Verdict.NACK, False, 3600_000)
    queues.advance(3599)
    assert queues.run_due("retrying") == []
    queues.advance(1)
    [last] = queues.run_due("retrying")
    assert last.message.attempt == 2
    assert announced == [("exhausted", message_id, "")]


def test_a_retry_without_a_delay_waits_the_queues_nack_redelivery_delay(
    queues: MemoryQueues, announced: list[Any]
) -> None:
    queue = get_queue("partner")
    message_id = queue.send({"n": 1})
    [outcome] = queues.run_due("partner")
    assert (outcome.verdict, outcome.delay_ms, str(outcome.error)) == (
        Verdict.NACK,
        None,
        "the partner is down",
    )
    queues.advance(4.9)
    assert queues.run_due("partner") == []
    queues.advance(0.1)
    [last] = queues.run_due("partner")
    assert last.message.attempt == 2
    assert announced == [("exhausted", message_id, "")]


def test_a_handlers_verdict_is_logged_in_one_line_that_says_things_once(
    queues: MemoryQueues, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, "retry in 1000 ms: retry in 1000 ms": the line's words, then the exception's
    # default text saying the same.
    for name in ("soon", "retrying", "partner", "default"):
        get_queue(name).send({"n": 1})
    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        for name in ("soon", "retrying", "partner", "default"):
            queues.run_due(name)
    said = [
        (r.getMessage().split(" id=")[0], r.getMessage().split("attempt=1")[1])
        for r in (caplog.records)
    ]
    assert said == [
        ("handler asked to retry message", " in 1000 ms"),
        ("handler asked to retry message", " in 3600000 ms: the partner said Retry-After: 3600"),
        ("handler asked to retry message", ": the partner is down"),
        ("handler postponed message", " by 1000 ms"),
    ]
    assert not [r for r in caplog.records if r.exc_info]  # none of them is a fault


def test_an_expired_message_is_announced_with_message_expired_only(
    queues: MemoryQueues, announced: list[Any]
) -> None:
    queue = get_queue("expiring")
    late = queue.send({"n": 1})  # EXPIRES: 60 s after its due time
    kept = queue.send({"n": 2}, expires=timedelta(hours=2))
    queues.advance(61)
    queues.run_due("expiring")
    assert announced == [("expired", late, EXPIRED)]
    assert queue.stats()["expired_total"] == 1
    assert queue.peek(kept) is None  # handled


# Tasks


@pytest.fixture
def tasks_queue(settings: Any, redis_server: RedisServer) -> Callable[..., Queue]:
    def configure(**options: Any) -> Queue:
        settings.DELAYQUEUES = {
            "default": {"URL": redis_server.url, "NACK_REDELIVERY_DELAY": 0, **options}
        }
        settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
        return get_queue("default")

    return configure


def work() -> None:
    call_command("run_delayqueue", "default", burst=True, verbosity=0)


def test_a_task_raising_postpone_waits_ready_without_using_an_attempt(
    tasks_queue: Callable[..., Queue],
) -> None:
    tasks_queue(RETRY_COUNT=0)
    expiry_tasks.postpones_left["n"] = 2
    result = expiry_tasks.postpones_then_runs.enqueue()
    work()
    result.refresh()
    assert (result.status, result.return_value, result.errors) == (
        TaskResultStatus.SUCCESSFUL,
        "ran",
        [],
    )


def test_a_task_raising_retry_is_a_failed_attempt_retried_later(
    tasks_queue: Callable[..., Queue],
) -> None:
    queue = tasks_queue(RETRY_COUNT=1)
    result = expiry_tasks.retries_later.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    [error] = result.errors
    assert error.exception_class_path == "delayqueue_django.exceptions.Retry"
    stored = queue.peek(result.id)
    assert stored is not None
    assert stored.state == "pending"
    assert stored.score_ms is not None
    assert stored.score_ms - queue.stats()["server_time_ms"] > 50_000


def test_a_task_whose_message_expired_is_failed(
    tasks_queue: Callable[..., Queue],
) -> None:
    tasks_queue(EXPIRES=0.05)
    result = expiry_tasks.postpones_then_runs.enqueue()
    time.sleep(0.1)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "delayqueue_django.exceptions.TaskExpired"


# Monitoring, and what a plain queue pays


@pytest.mark.django_db
def test_prometheus_counts_expired_and_postponed(settings: Any, redis_server: RedisServer) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = "a-long-random-scrape-token-0123456789"
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url}}
    queue = get_queue()
    queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    queue.postpone([message], delay=0.05)
    expiring = queue.send({"n": 2}, expires=0.05)
    time.sleep(0.1)
    queue.fetch(0)
    stored = queue.peek(expiring)
    assert stored is not None
    assert stored.dead_reason == EXPIRED
    response = Client().get(
        "/metrics/", headers={"Authorization": f"Bearer {settings.DELAYQUEUE_METRICS_TOKEN}"}
    )
    text = response.content.decode()
    assert 'delayqueue_expired_total{queue="default"} 1.0' in text
    assert 'delayqueue_postponed_total{queue="default"} 1.0' in text


def test_a_plain_queue_never_writes_the_expiry_structures(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "RETRY_COUNT": 0}}
    queue = get_queue()
    queue.send_many([{"n": n} for n in range(3)])
    first, second, third = queue.fetch(3).messages
    queue.ack([first])
    queue.nack([second], delay=0)
    queue.bury([third])
    queue.fetch(1)
    client = redis_store(queue).client
    tag = queue.store.keys.tag
    for name in ("expires", "postpones", "dead_reason"):
        assert not client.exists(f"{tag}:{name}")


def test_the_expiry_structures_are_cleaned_up_as_messages_leave(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url}}
    queue = get_queue()
    acked = queue.send({"n": 1}, expires=60)
    postponed = queue.send({"n": 2}, expires=60)
    messages = {message.id: message for message in queue.fetch(2).messages}
    queue.postpone([messages[postponed]], delay=0)
    queue.ack([messages[acked]])
    assert queue.cancel(postponed)
    client = redis_store(queue).client
    tag = queue.store.keys.tag
    for name in ("expires", "postpones", "dead_reason"):
        assert not client.exists(f"{tag}:{name}")


def test_an_ack_of_messages_fetched_from_a_plain_queue_skips_the_expiry_structures(
    settings: Any, redis_server: RedisServer
) -> None:
    """The fetch says whether the queue had expiries or postpone counts; without them, the
    ack does not look for them (a plain queue's ack costs what it did before expiry)."""
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url}}
    queue = get_queue()
    client = redis_store(queue).client
    queue.send({"n": 1})
    [plain] = queue.fetch(1).messages
    assert not plain.tracked
    client.config_resetstat()
    queue.ack([plain])
    assert "cmdstat_exists" not in client.info("commandstats")

    queue.send({"n": 2}, expires=60)
    [expiring] = queue.fetch(1).messages
    assert expiring.tracked
    queue.ack([expiring])
    assert not client.exists(f"{queue.store.keys.tag}:expires")
