"""The admin's page of a message that ended (#35): on a queue with HISTORY_RETENTION, a
message acked, cancelled or purged is found by its id or key, and its page says how and when
it ended, its attempts and the worker that acked it, instead of "not found"; a damaged
record is shown as such; without the option, or once the record is gone, a 404 as before."""

import re
from datetime import timedelta
from typing import Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.admin_pages import SHOWN_TIME, cells, superuser, url
from tests.conftest import MEMORY_URL, queue_settings
from tests.helpers import redis_store

pytestmark = pytest.mark.django_db

WORKER = "web-3:4242:9f1c2a"


@pytest.fixture(params=["redis", "memory"])
def kept(request: pytest.FixtureRequest, settings: Any) -> Queue:
    url = MEMORY_URL if request.param == "memory" else settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = queue_settings(url, HISTORY_RETENTION=timedelta(hours=1))
    return get_queue()


def test_an_acked_message_has_a_page_saying_how_when_and_by_which_worker(kept: Queue) -> None:
    message_id = kept.send({"order": 42}, key="reminder:<42>")
    [first] = kept.fetch(1, fetcher=WORKER).messages
    kept.nack([first], delay=0)
    [again] = kept.fetch(1, fetcher=WORKER).messages
    kept.ack([again], fetcher=WORKER)

    response = superuser().get(url("message", "default", message_id))
    assert response.status_code == 200
    page = response.content.decode()
    shown = cells(page)
    assert shown["State"] == "acked: handled: its handler returned, and the worker acked it"
    assert re.fullmatch(SHOWN_TIME, shown["Ended"]), shown["Ended"]
    assert shown["Attempts"] == "2"
    assert shown["Worker"] == WORKER
    assert shown["Key"] == "reminder:<42>"
    assert "reminder:&lt;42&gt;" in page
    assert "kept for 1:00:00 after it ended" in page
    # Nothing to act on.
    assert "Requeue" not in page
    assert "Delete" not in page


@pytest.mark.parametrize(
    ("end", "state"),
    [("cancel", "cancelled"), ("purge", "purged")],
)
def test_a_cancelled_or_purged_message_has_its_page(kept: Queue, end: str, state: str) -> None:
    if end == "cancel":
        message_id = kept.send({"n": 1}, delay=3600)
        kept.cancel(message_id)
        attempts = "0 (never delivered)"
    else:
        message_id = kept.send({"n": 1}, retry_count=0)
        [message] = kept.fetch(1).messages
        kept.nack([message])
        kept.purge_garbage()
        attempts = "1"
    shown = cells(superuser().get(url("message", "default", message_id)).content.decode())
    assert shown["State"].startswith(f"{state}: ")
    assert shown["Attempts"] == attempts
    assert shown["Worker"] == "—"


def test_the_search_finds_a_message_that_ended_by_key_and_by_id(kept: Queue) -> None:
    message_id = kept.send({"order": 7}, key="order:7")
    [message] = kept.fetch(1, fetcher=WORKER).messages
    kept.ack([message], fetcher=WORKER)
    client = superuser()
    for text in ("order:7", message_id):
        page = client.get(url("detail", "default"), {"find": text}).content.decode()
        found = re.search(r'<table class="dq-found">(.*?)</table>', page, re.S)
        assert found is not None, text
        assert f'href="{url("message", "default", message_id)}"' in found[1]
        assert "<td>acked</td>" in found[1]
        assert re.search(rf"<td>{SHOWN_TIME}</td>", found[1])


def test_without_the_option_or_a_record_an_ended_message_is_not_found(settings: Any) -> None:
    queue = get_queue()
    message_id = queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    queue.ack([message])
    client = superuser()
    assert client.get(url("message", "default", message_id)).status_code == 404
    settings.DELAYQUEUES = queue_settings(
        settings.DELAYQUEUES["default"]["URL"], HISTORY_RETENTION=3600
    )
    assert client.get(url("message", "default", "never-sent")).status_code == 404


@pytest.mark.parametrize("raw", [b"nonsense", b"acked:soon:1:0:", b"acked:1:1:99:short"])
def test_a_damaged_outcome_record_is_shown_as_such(settings: Any, raw: bytes) -> None:
    settings.DELAYQUEUES = queue_settings(
        settings.DELAYQUEUES["default"]["URL"], HISTORY_RETENTION=3600
    )
    queue = get_queue()
    store = redis_store(queue)
    store.client.set(store.keys.key("ended:some-id"), raw)
    response = superuser().get(url("message", "default", "some-id"))
    assert response.status_code == 200
    shown = cells(response.content.decode())
    assert shown["State"] == "damaged record: its outcome record cannot be read"
