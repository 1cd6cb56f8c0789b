"""Keys on EXACTLY_ONCE queues (issue #26): processed records are per message id and
generation, so a key reused after its message was handled, and a message replaced after a
delivery of it committed, both run; pruning still clears the records of both generations
once the message is gone. On SQLite, PostgreSQL and MariaDB; on Redis and in memory."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command

from delayqueue_django import get_queue
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.outbox import exactly_once
from delayqueue_django.outbox.models import ProcessedMessage
from delayqueue_django.worker.handling import Verdict, call_handler
from tests.conftest import MEMORY_URL
from tests.databases import database_params
from tests.helpers import fetch_when_due
from tests.task_app.models import Effect


@pytest.fixture(params=database_params())
def database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    alias: str = request.param
    monkeypatch.setattr(exactly_once, "_prune_cursors", {})  # each test prunes from the start
    return alias


@pytest.fixture(params=["redis", "memory"])
def queue(request: pytest.FixtureRequest, database: str, settings: Any) -> Queue:
    """The default queue, EXACTLY_ONCE on the database under test, on Redis or in memory,
    whose deliveries time out after 0.2 s."""
    url = MEMORY_URL if request.param == "memory" else settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {
        "default": {
            "URL": url,
            "EXACTLY_ONCE": database,
            "MAX_CONSUME_DURATION": 0.2,
            "NACK_REDELIVERY_DELAY": 0,
        }
    }
    return get_queue()


def writer(alias: str) -> Callable[[Message], None]:
    """A handler that writes one row per run."""

    def handle(message: Message) -> None:
        Effect.objects.using(alias).create(message_id=message.id)

    return handle


def effects(alias: str) -> list[str]:
    return list(Effect.objects.using(alias).order_by("id").values_list("message_id", flat=True))


def records(alias: str) -> list[tuple[str, int]]:
    rows = ProcessedMessage.objects.using(alias).order_by("id")
    return list(rows.values_list("message_id", "generation"))


def test_a_key_reused_after_its_message_was_handled_runs_again(queue: Queue, database: str) -> None:
    first_id = queue.send("x", key="order-1")
    [first] = fetch_when_due(queue)
    assert call_handler(writer(database), first).verdict is Verdict.ACK
    assert queue.ack([first]) == {first_id}
    second_id = queue.send("y", key="order-1")
    assert second_id != first_id
    [second] = fetch_when_due(queue)
    assert call_handler(writer(database), second).verdict is Verdict.ACK
    assert effects(database) == [first_id, second_id]


def test_a_message_replaced_after_a_delivery_committed_runs_its_new_content(
    queue: Queue, database: str
) -> None:
    """Its worker died after the handler's transaction committed, before the ack: the
    message waits again, and a send replaces it. Its new content has a new generation,
    which no processed record names: it runs."""
    message_id = queue.send({"v": 1}, key="digest", retry_count=3)
    [first] = fetch_when_due(queue)
    assert call_handler(writer(database), first).verdict is Verdict.ACK
    time.sleep(0.3)
    assert queue.fetch(0).expired == 1  # the delivery timed out: it waits again
    assert queue.send({"v": 2}, key="digest", if_exists="replace") == message_id
    [second] = fetch_when_due(queue)
    assert (second.id, second.payload) == (message_id, {"v": 2})
    assert second.generation > first.generation > 0
    assert call_handler(writer(database), second).verdict is Verdict.ACK
    assert effects(database) == [message_id, message_id]
    assert records(database) == [(message_id, first.generation), (message_id, second.generation)]
    # Both records stay while their message is held, and go once it is acked.
    time.sleep(0.01)
    assert exactly_once.prune("default", database, retention_ms=0) == 0
    assert queue.ack([second]) == {message_id}
    assert exactly_once.prune("default", database, retention_ms=0) == 2
    assert records(database) == []


def test_a_redelivery_of_the_same_generation_is_still_acked_without_running(
    queue: Queue, database: str
) -> None:
    message_id = queue.send("x", key="order-1", retry_count=3)
    [first] = fetch_when_due(queue)
    assert call_handler(writer(database), first).verdict is Verdict.ACK
    time.sleep(0.3)
    [again] = fetch_when_due(queue)  # timed out, handed out again: same content
    assert (again.id, again.generation, again.attempt) == (message_id, first.generation, 2)
    assert call_handler(writer(database), again).verdict is Verdict.ACK
    assert effects(database) == [message_id]  # not run again


def test_an_unkeyed_message_is_recorded_as_generation_0(queue: Queue, database: str) -> None:
    message_id = queue.send("x")
    [message] = fetch_when_due(queue)
    assert message.generation == 0
    assert call_handler(writer(database), message).verdict is Verdict.ACK
    assert records(database) == [(message_id, 0)]


@pytest.mark.django_db  # (makemigrations reads the applied migrations)
def test_the_migrations_match_the_models() -> None:
    """The generation column and its constraint come with a migration (0004)."""
    call_command("makemigrations", "delayqueue_django", "--check", "--dry-run", verbosity=0)
