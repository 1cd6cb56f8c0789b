"""Ordered groups (issue #27) in the admin: a message's page shows its group (escaped), a
parked message (waiting for its group) shows as pending at its due time, and a queue whose
pending messages are all parked still shows its page and its stats."""

import html
import re
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from tests.helpers import fetch_when_due, store_time_ms

pytestmark = pytest.mark.django_db

XSS_GROUP = '<b>customer "42"</b>'


def viewer() -> Client:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="delayqueue_django", codename="view_queue")
    )
    client = Client()
    client.force_login(user)
    return client


def message_page(message_id: str) -> str:
    address = reverse("admin:delayqueue_django_queue_message", args=["default", message_id])
    return viewer().get(address).content.decode()


def group_cell(page: str) -> str:
    cell = re.search(r'<td class="dq-group">(.*?)</td>', page, re.S)
    assert cell is not None
    return html.unescape(cell.group(1))


def test_the_message_page_shows_the_group_escaped() -> None:
    queue = get_queue()
    holder = queue.send({"n": 1}, group=XSS_GROUP)
    parked = queue.send({"n": 2}, group=XSS_GROUP)
    before = store_time_ms(queue)
    [delivery] = fetch_when_due(queue, 10)
    assert delivery.id == holder
    page = message_page(parked)
    assert XSS_GROUP not in page
    assert group_cell(page) == XSS_GROUP
    # Parked behind its group's holder: pending, due when it was sent (not in the far future).
    assert re.search(r"<th>State</th><td><a [^>]*>pending</a>", page)
    stored = queue.peek(parked)
    assert stored is not None
    assert stored.score_ms is not None
    assert stored.score_ms <= before


def test_the_message_page_of_a_message_without_group_shows_none() -> None:
    message_id = get_queue().send({"plain": True}, delay=600)
    assert group_cell(message_page(message_id)) == "—"


def test_the_message_page_of_a_keyed_grouped_message_shows_both() -> None:
    queue = get_queue()
    holder = queue.send({"n": 1}, group="g")
    parked = queue.send({"n": 2}, key="order:42", group="g")
    [delivery] = fetch_when_due(queue, 10)
    assert delivery.id == holder
    page = message_page(parked)
    assert group_cell(page) == "g"
    key = re.search(r'<td class="dq-key">(.*?)</td>', page, re.S)
    assert key is not None
    assert html.unescape(key.group(1)) == "order:42"


def test_a_queue_whose_pending_messages_are_all_parked_shows_its_page_and_stats() -> None:
    # Parked messages are scored far beyond any due time: taken for the next due time, they
    # made the queue page and delayqueue_stats fail on a date in the year 144,740.
    queue = get_queue()
    for n in range(3):
        queue.send({"n": n}, group="g")
    assert len(fetch_when_due(queue, 10)) == 1
    assert queue.fetch(10).messages == []  # the other two parked
    response = viewer().get(reverse("admin:delayqueue_django_queue_detail", args=["default"]))
    assert response.status_code == 200
    out = StringIO()
    call_command("delayqueue_stats", stdout=out)
    assert "default" in out.getvalue()
