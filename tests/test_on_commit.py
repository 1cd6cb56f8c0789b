"""Sending when the database transaction commits."""

from typing import Any

import pytest
from django.db import transaction

import delayqueue_django as delayqueue
from delayqueue_django.exceptions import InvalidDelay
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)


def pending() -> int:
    return delayqueue.get_queue().stats()["pending"]


def test_a_message_sent_on_commit_is_written_only_when_the_transaction_commits() -> None:
    with transaction.atomic():
        message_id = delayqueue.send({"order": 1}, delay=60, on_commit=True)
        assert pending() == 0  # not yet: the transaction may still roll back
    assert pending() == 1
    assert delayqueue.get_queue().peek(message_id) is not None  # the id returned at once


def test_nothing_is_sent_when_the_transaction_rolls_back() -> None:
    with transaction.atomic():
        delayqueue.send({"order": 1}, on_commit=True)
        delayqueue.get_queue().send_many([1, 2, 3], on_commit=True)
        transaction.set_rollback(True)
    assert pending() == 0


def test_outside_a_transaction_on_commit_sends_at_once() -> None:
    delayqueue.send("now", on_commit=True)
    assert pending() == 1


def test_bad_input_raises_at_the_call_not_at_the_commit() -> None:
    with transaction.atomic(), pytest.raises(InvalidDelay):
        delayqueue.send("x", delay=-1, on_commit=True)
    assert pending() == 0


def test_the_queue_default_applies_and_a_call_can_override_it(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "SEND_ON_COMMIT": True}}
    with transaction.atomic():
        delayqueue.send("deferred")
        delayqueue.send("immediate", on_commit=False)
        assert pending() == 1
    assert pending() == 2


def test_the_default_is_to_send_at_once() -> None:
    assert delayqueue.get_queue().config.send_on_commit is False
    with transaction.atomic():
        delayqueue.send("x")
        assert pending() == 1
