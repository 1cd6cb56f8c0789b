"""The admin's lists of messages show each one's key and ordered group, escaped (issue #33):
in every state, on every store (the lists read them in the same call as the page)."""

import html
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.helpers import fetch_when_due

pytestmark = pytest.mark.django_db

XSS_KEY = '<i>order "42"</i>'
XSS_GROUP = "<b>customer & co</b>"


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def listed(state: str) -> dict[str, tuple[str, str]]:
    """The page of ``state``'s messages: id -> (key, group) as a reader sees them."""
    client = Client()
    root = User.objects.filter(username="root").first()
    client.force_login(root or User.objects.create_superuser("root", password="pw"))
    page = client.get(url("detail", "default") + f"?state={state}").content.decode()
    table = page[page.index('<table id="result_list">') :]
    table = table[: table.index("</table>")]
    assert "<th>Key</th><th>Group</th>" in table
    assert XSS_KEY not in table
    assert XSS_GROUP not in table
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S):
        message_id = re.search(r'<a href="[^"]*">([^<]*)</a>', row)
        key = re.search(r'<td class="dq-key">(.*?)</td>', row, re.S)
        group = re.search(r'<td class="dq-group">(.*?)</td>', row, re.S)
        assert message_id is not None
        assert key is not None
        assert group is not None
        rows[html.unescape(message_id.group(1))] = (
            html.unescape(key.group(1)),
            html.unescape(group.group(1)),
        )
    return rows


def one_of_each(queue: Queue) -> dict[str, str]:
    """A keyed message, a grouped one and a plain one, all pending; their ids by kind."""
    return {
        "keyed": queue.send({"n": 1}, key=XSS_KEY, delay=600),
        "grouped": queue.send({"n": 2}, group=XSS_GROUP, delay=600),
        "plain": queue.send({"n": 3}, delay=600),
    }


def test_the_pending_list_shows_each_messages_key_and_group_escaped(backend_url: str) -> None:
    ids = one_of_each(get_queue())
    assert listed("pending") == {
        ids["keyed"]: (XSS_KEY, "—"),
        ids["grouped"]: ("—", XSS_GROUP),
        ids["plain"]: ("—", "—"),
    }


def test_every_list_shows_the_key_and_group_of_its_messages() -> None:
    queue = get_queue()
    holder = queue.send({"n": 1}, key="k-holder", group="g")
    parked = queue.send({"n": 2}, key="k-parked", group="g")
    [delivery] = fetch_when_due(queue, 10)
    assert delivery.id == holder
    assert listed("unack") == {holder: ("k-holder", "g")}
    assert listed("pending") == {parked: ("k-parked", "g")}  # parked behind its holder
    queue.bury([delivery])
    assert listed("garbage") == {holder: ("k-holder", "g")}
    staged = queue.send({"n": 3}, key="k-staged", group="h")
    queue.fetch(0)  # stages what is due, hands nothing out
    assert staged in listed("ready")
    assert listed("ready")[staged] == ("k-staged", "h")
