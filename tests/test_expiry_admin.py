"""The admin and expiry (issue #27): a dead letter's page says why it died, and an expired
one is requeued from there to run without its expiry."""

import re
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from tests.helpers import states_of

pytestmark = pytest.mark.django_db


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def test_an_expired_dead_letter_says_so_and_is_requeued_without_its_expiry() -> None:
    queue = get_queue()
    expired = queue.send({"n": 1}, expires=0.05)
    exhausted = queue.send({"n": 2}, retry_count=0)
    time.sleep(0.1)
    [message] = queue.fetch(10).messages
    assert message.id == exhausted
    queue.nack([message])
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))

    page = client.get(url("message", "default", expired)).content.decode()
    reason = re.search(r'<td class="dq-dead-reason">(.*?)</td>', page)
    assert reason is not None
    assert reason.group(1).startswith("expired: dead-lettered at ")
    assert reason.group(1).endswith(" A requeue runs it without its expiry.")
    page = client.get(url("message", "default", exhausted)).content.decode()
    assert (
        '<td class="dq-dead-reason">retries used up: attempt 1 was its last (the first, with no '
        "retry); its handler returned False (see Attempts)</td>"
    ) in page

    client.post(url("action", "default"), {"action": "requeue", "ids": [expired]})
    assert states_of(queue, expired) == ["pending"]
    [again] = queue.fetch(1).messages
    assert again.id == expired
