"""A payload that is valid JSON but nested too deeply for this process to decode (another
process, stack depth or Python version encoded it) is an undecodable payload like any other:
buried with a warning, never a crash of the fetch that met it, the admin or an announcement."""

import logging

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from tests.helpers import states_of

TOO_DEEP = "[" * 100_000 + "]" * 100_000


def test_the_deep_payload_is_buried_and_its_batch_delivered(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    queue.store.send([NewMessage("deep", TOO_DEEP, 3), NewMessage("fine", '"ok"', 3)])
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        fetched = queue.fetch(10)
    assert [(m.id, m.payload) for m in fetched.messages] == [("fine", "ok")]
    assert states_of(queue, "deep") == ["garbage"]
    assert "nested too deeply to decode" in caplog.text
    [claim] = queue.claim_exhausted()
    assert (claim.id, claim.payload) == ("deep", None)


@pytest.mark.django_db
def test_the_admin_shows_the_deep_payload_as_stored() -> None:
    get_queue().store.send([NewMessage("deep", TOO_DEEP, 3)])
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = reverse("admin:delayqueue_django_queue_message", args=["default", "deep"])
    response = client.get(url)
    assert response.status_code == 200
    assert "[[[[" in response.content.decode()
