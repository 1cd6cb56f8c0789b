"""The admin and keys: the queue page's search box finds a message by key or by id, and a
message's page shows its key, escaped."""

import html
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.helpers import fetch_when_due

pytestmark = pytest.mark.django_db

KEY = "order-42-expiry"
LATER = 600


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def make_user(name: str, *permissions: str) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayqueue_django", codename=codename)
        )
    return user


def client_for(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def queue() -> Queue:
    return get_queue()


def put(queue: Queue, state: str, key: str = KEY) -> str:
    """A message with ``key`` in ``state`` (a state of the queue page's listings)."""
    message_id = queue.send({"order": 42}, key=key, delay=LATER if state == "pending" else 0)
    if state == "pending":
        return message_id
    if state == "ready":
        queue.fetch(0)  # stages what is due, hands nothing out
        return message_id
    [delivery] = fetch_when_due(queue)
    assert delivery.id == message_id
    if state == "retry":
        queue.nack([delivery], delay=0)
        queue.fetch(0)
    elif state == "garbage":
        queue.bury([delivery])
    return message_id


def found_rows(page: str) -> list[list[str]]:
    """The cells of the search's table of results, unescaped and without their tags."""
    match = re.search(r'<table class="dq-found">(.*?)</table>', page, re.S)
    if match is None:
        return []
    rows = re.findall(r"<tr>(.*?)</tr>", match.group(1).split("<tbody>")[1], re.S)
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td>(.*?)</td>", row, re.S)
        ]
        for row in rows
    ]


def search(user: User, text: str) -> str:
    response = client_for(user).get(url("detail", "default"), {"find": text})
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def viewer() -> User:
    return make_user("viewer", "view_queue")


@pytest.mark.parametrize("state", ["pending", "ready", "unack", "retry", "garbage"])
def test_the_search_finds_a_message_by_its_key_in_each_state(
    viewer: User, queue: Queue, state: str
) -> None:
    message_id = put(queue, state)
    page = search(viewer, KEY)
    [[by, shown_id, key, shown_state, _when, _attempt]] = found_rows(page)
    assert (by, shown_id, key, shown_state) == ("key", message_id, KEY, state)
    assert f'href="{url("message", "default", message_id)}"' in page


def test_the_search_finds_a_message_by_its_id(viewer: User, queue: Queue) -> None:
    plain_id = queue.send({"plain": True}, delay=LATER)
    keyed_id = put(queue, "pending")
    [[by, shown_id, key, state, _when, _attempt]] = found_rows(search(viewer, plain_id))
    assert (by, shown_id, key, state) == ("id", plain_id, "—", "pending")
    [row] = found_rows(search(viewer, keyed_id))
    assert row[:4] == ["id", keyed_id, KEY, "pending"]


def test_a_text_that_is_a_key_and_another_messages_id_finds_both(
    viewer: User, queue: Queue
) -> None:
    plain_id = queue.send({"plain": True}, delay=LATER)
    keyed_id = put(queue, "pending", key=plain_id)
    rows = found_rows(search(viewer, plain_id))
    assert [row[:3] for row in rows] == [["key", keyed_id, plain_id], ["id", plain_id, "—"]]


def test_a_key_that_names_nothing_says_so(viewer: User, queue: Queue) -> None:
    queue.send({"order": 1}, key="handled")
    [delivery] = fetch_when_due(queue)
    queue.ack([delivery])
    queue.send({"order": 2}, key="cancelled", delay=LATER)
    assert queue.cancel(key="cancelled")
    for key in ("never-used", "handled", "cancelled"):
        page = search(viewer, key)
        assert found_rows(page) == []
        assert f"No message under key “{key}”, nor with that id." in page


def test_a_text_too_long_for_a_key_is_searched_as_an_id_and_says_why(
    viewer: User, queue: Queue
) -> None:
    page = search(viewer, "k" * 300)
    assert found_rows(page) == []
    assert "It cannot be a key: key is 300 bytes in UTF-8; a key is at most 256." in page


def test_an_empty_search_searches_nothing(viewer: User, queue: Queue) -> None:
    put(queue, "pending")
    page = search(viewer, "")
    assert 'class="dq-found"' not in page
    assert "No message under key" not in page


XSS_KEY = """<script>alert("key's")</script>"""


def test_a_key_with_html_and_quotes_is_escaped_in_the_search_and_on_the_message_page(
    viewer: User, queue: Queue
) -> None:
    message_id = put(queue, "pending", key=XSS_KEY)
    page = search(viewer, XSS_KEY)
    assert XSS_KEY not in page
    [row] = found_rows(page)
    assert row[:3] == ["key", message_id, XSS_KEY]
    # In the box, the text searched is an escaped attribute value.
    assert 'value="&lt;script&gt;alert(&quot;key&#x27;s&quot;)&lt;/script&gt;"' in page
    unknown = search(viewer, XSS_KEY + "!")
    assert XSS_KEY not in unknown
    assert "No message under key “&lt;script&gt;" in unknown

    message_page = client_for(viewer).get(url("message", "default", message_id)).content.decode()
    assert XSS_KEY not in message_page
    cell = re.search(r'<td class="dq-key">(.*?)</td>', message_page, re.S)
    assert cell is not None
    assert html.unescape(cell.group(1)) == XSS_KEY


def test_the_message_page_of_a_message_without_key_shows_none(viewer: User, queue: Queue) -> None:
    message_id = queue.send({"plain": True}, delay=LATER)
    page = client_for(viewer).get(url("message", "default", message_id)).content.decode()
    assert '<td class="dq-key">—</td>' in page


@pytest.mark.parametrize(("user", "expected"), [("anonymous", 302), ("staff", 403)])
def test_searching_needs_the_view_permission(queue: Queue, user: str, expected: int) -> None:
    put(queue, "pending")
    who = None if user == "anonymous" else make_user(user)
    response = client_for(who).get(url("detail", "default"), {"find": KEY})
    assert response.status_code == expected
    assert KEY not in response.content.decode()


def test_the_search_is_a_get_form_that_changes_nothing(viewer: User, queue: Queue) -> None:
    message_id = put(queue, "pending")
    page = search(viewer, KEY)
    form = re.search(r'<form method="(\w+)" action="#find" class="dq-find">', page)
    assert form is not None
    assert form.group(1) == "get"
    found = queue.lookup(KEY)
    assert found is not None
    assert (found.id, found.state, found.attempt) == (message_id, "pending", 0)
