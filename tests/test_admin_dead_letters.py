"""A dead letter's page says what is known of it (issue #33): an expired one its attempt and
retries (not "?") and that it expired, and when; another, from its attempts and retry
budget, whether its retries were used up or it was rejected before they were, and (#35)
from its last attempt's record how that attempt ended."""

import re
import time
from typing import Any

import pytest
from django.test import Client

from delayqueue_django import get_queue
from tests.admin_pages import SHOWN_TIME, cells, superuser, url
from tests.attempt_records import PAYMENT_DOWN, PaymentDown, bury_with, forget
from tests.helpers import fetch_when_due

pytestmark = pytest.mark.django_db


def message_cells(client: Client, message_id: str) -> dict[str, str]:
    return cells(client.get(url("message", "default", message_id)).content.decode())


def dead_letter_row(client: Client, message_id: str) -> str:
    page = client.get(url("detail", "default") + "?state=garbage").content.decode()
    row = re.search(rf"<tr>(?:(?!</tr>).)*?>{re.escape(message_id)}</a>.*?</tr>", page, re.S)
    assert row is not None
    return row.group(0)


def test_an_expired_dead_letter_shows_its_attempt_and_retries_and_when_it_expired(
    backend_url: str,
) -> None:
    # Buried by a fetch before any delivery: on Redis it has no meta record of its own (a
    # delivery writes one), and its page said "Attempt ?" and "Retries left ? of ?".
    queue = get_queue()
    expired = queue.send({"n": 1}, expires=0.05, retry_count=4)
    time.sleep(0.1)
    assert queue.fetch(10).messages == []
    stored = queue.peek(expired)
    assert stored is not None
    assert (stored.state, stored.dead_reason) == ("garbage", "expired")
    assert (stored.attempt, stored.budget) == (0, 4)

    client = superuser()
    shown = message_cells(client, expired)
    assert shown["Attempt"] == "0 (never delivered)"
    assert shown["Retries left"] == "4 of 4"
    assert re.fullmatch(
        rf"expired: dead-lettered at {SHOWN_TIME}, when its expiry had passed before it could "
        r"be delivered \(or tried again\)\. A requeue runs it without its expiry\.",
        shown["Why it died"],
    ), shown["Why it died"]
    assert "?" not in shown["Attempt"] + shown["Retries left"]
    # The list of dead letters too: its attempt and retries, not question marks.
    [page_entry] = [
        entry
        for entry in queue.list_messages("garbage", offset=0, limit=10, preview_bytes=10)
        if entry.id == expired
    ]
    assert (page_entry.attempt, page_entry.budget) == (0, 4)
    row = dead_letter_row(client, expired)
    assert "<td>0</td>" in row
    assert "<td>4</td>" in row


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_dead_letter_says_whether_its_retries_were_used_up_or_it_was_rejected(
    backend: str, settings: Any
) -> None:
    if backend == "memory":
        settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    queue = get_queue()
    used_up = queue.send({"n": 1}, retry_count=1)
    rejected = queue.send({"n": 2}, retry_count=3)
    for _ in range(2):
        deliveries = {m.id: m for m in fetch_when_due(queue, 10)}
        queue.nack([deliveries[used_up]], delay=0)
        if rejected in deliveries:
            queue.nack([deliveries[rejected]], delay=0)
    # Attempt 2 of "rejected" is buried at once (a Reject), two of its three retries left.
    [again] = fetch_when_due(queue, 10)
    assert again.id == rejected
    queue.bury([again])

    client = superuser()
    shown = message_cells(client, used_up)
    # Its last attempt's record says how that attempt ended (nack: the handler's False).
    assert shown["Why it died"] == (
        "retries used up: attempt 2 was its last (the first and 1 retry); its handler "
        "returned False (see Attempts)"
    )
    assert shown["Retries left"] == "0 of 1"
    shown = message_cells(client, rejected)
    assert shown["Why it died"] == (
        "rejected on attempt 3, with 1 of its 3 retries left: its handler raised Reject, its "
        "payload could not be decoded, or Queue.bury() buried it"
    )
    assert shown["Retries left"] == "1 of 3"


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_dead_letter_says_what_its_last_attempt_raised_or_as_before_without_a_record(
    backend: str, settings: Any
) -> None:
    if backend == "memory":
        settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    queue = get_queue()
    raised_id = bury_with(queue, PaymentDown("provider said 503"))
    old = bury_with(queue, None)
    forget(queue, old)  # as one buried before attempt records were kept

    client = superuser()
    assert message_cells(client, raised_id)["Why it died"] == (
        "retries used up: attempt 1 was its last (the first, with no retry); its handler "
        f"raised {PAYMENT_DOWN} (see Attempts)"
    )
    assert message_cells(client, old)["Why it died"] == (
        "retries used up: attempt 1 was its last (the first, with no retry); it failed, timed "
        "out or was rejected"
    )
