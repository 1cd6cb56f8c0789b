"""The admin's pages of failures (#35): a message's Attempts table (tracebacks only for those
who may change the queue), the dead letters' "last error" column and filter by error class,
and the bulk requeue and delete of every dead letter of one class, after a confirmation.

Records here are written where the store keeps them, packed as its scripts pack them
(``engine.history``): as a release that wrote them would have, and, for the tests of bad
data, as no release writes them."""

import html
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.admin import error_actions, error_classes
from delayqueue_django.core.attempts import worker_name
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.store import ShardedStore
from tests.attempt_records import (
    PAYMENT_DOWN,
    PaymentDown,
    bury_with,
    forget,
    plant,
    raised,
    record,
)
from tests.backends import SHARDED_BACKENDS
from tests.conftest import MEMORY_URL, queue_settings
from tests.helpers import fetch_when_due, redis_store, states_of

pytestmark = pytest.mark.django_db

SHOWN_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def user_with(name: str, *permissions: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayqueue_django", codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


def superuser(**kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def bury(queue: Queue, payload: Any = "dead") -> str:
    """A dead letter whose handler returned False (its record says only "nack")."""
    return bury_with(queue, None, payload)


def bury_bare(queue: Queue) -> str:
    """A dead letter without a record, as one of a release before them."""
    message_id = bury(queue)
    forget(queue, message_id)
    return message_id


def text_of(fragment: str) -> str:
    """The text a reader sees: inline tags dropped, the others a space."""
    inline = re.sub(r"</?(?:code|span|em|strong|a)\b[^>]*>", "", fragment)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def attempts_table(page: str) -> list[str]:
    """The Attempts table's rows, as text, newest first."""
    table = re.search(r'<table class="dq-attempts">(.*?)</table>', page, re.S)
    assert table is not None, "no Attempts table"
    return [text_of(row) for row in re.findall(r"<tr class=\"dq-attempt.*?</tr>", table[1], re.S)]


@pytest.fixture(params=["redis", "memory"])
def queue(request: pytest.FixtureRequest, settings: Any) -> Queue:
    if request.param == "memory":
        settings.DELAYQUEUES = queue_settings(MEMORY_URL)
    return get_queue()


# The message page's Attempts table


def test_the_message_page_shows_its_attempts_newest_first(queue: Queue) -> None:
    message_id = bury(queue)
    plant(
        queue,
        message_id,
        [
            record(1, "shop.errors.PaymentDown", "the provider said 503"),
            record(
                2,
                "",
                "",
                verdict="lease expired",
                traceback="",
                worker="",
                started_ms=None,
                ended_ms=1_700_000_090_000,
            ),
        ],
    )
    page = superuser().get(url("message", "default", message_id)).content.decode()
    second, first = attempts_table(page)
    assert re.fullmatch(rf"2 lease expired — {SHOWN_TIME} — —", second), second
    assert re.fullmatch(
        rf"1 error shop\.errors\.PaymentDown: the provider said 503 Traceback "
        rf'Traceback \(most recent call last\): File "shop/tasks\.py", line 9 {SHOWN_TIME} '
        r"1\.250 s web-1:4242",
        first,
    ), first
    assert "<details" in page


def test_the_attempts_table_shows_the_records_its_refusals_wrote(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, retry_count=1)
    for error in (PaymentDown("provider said 503"), ValueError("bad <b>amount</b>")):
        [message] = [m for m in fetch_when_due(queue) if m.id == message_id]
        note = queue.attempt_note(message, raised(error), ran_seconds=0.25)
        queue.nack([message], delay=0, attempts={message_id: note})
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"

    page = superuser().get(url("message", "default", message_id)).content.decode()
    newest, first = attempts_table(page)
    worker = re.escape(worker_name())
    assert re.fullmatch(
        r"2 error builtins\.ValueError: bad <b>amount</b> Traceback .*raise error.* "
        rf"{SHOWN_TIME} 0\.2\d\d s {worker}",
        newest,
    ), newest
    assert re.match(rf"1 error {re.escape(PAYMENT_DOWN)}: provider said 503 Traceback", first)
    assert "bad &lt;b&gt;amount&lt;/b&gt;" in page


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_the_attempts_table_of_a_message_on_a_sharded_queue(
    configure: Callable[..., Queue], backend_url: str
) -> None:
    queue = configure()
    dead = [bury_with(queue, PaymentDown(f"provider said 503 ({n})")) for n in range(8)]
    store = queue.store
    assert isinstance(store, ShardedStore)
    assert len({store.shard_for(message_id) for message_id in dead}) > 1
    client = superuser()
    for n, message_id in enumerate(dead):
        page = client.get(url("message", "default", message_id)).content.decode()
        [row] = attempts_table(page)
        assert row.startswith(f"1 error {PAYMENT_DOWN}: provider said 503 ({n})"), row


def test_a_message_that_never_failed_says_so(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=60)
    page = superuser().get(url("message", "default", message_id)).content.decode()
    assert "No failed attempt recorded." in page
    assert "dq-attempts" not in page


@pytest.mark.parametrize(
    ("permissions", "shown"),
    [(("view_queue",), False), (("view_queue", "change_queue"), True), (("change_queue",), True)],
)
def test_tracebacks_are_shown_only_to_users_who_may_change_the_queue(
    queue: Queue, permissions: tuple[str, ...], shown: bool
) -> None:
    message_id = bury(queue)
    plant(queue, message_id, [record(1, traceback="Traceback: SECRET-LOCALS line\n")])
    page = user_with("someone", *permissions).get(url("message", "default", message_id))
    assert page.status_code == 200
    text = page.content.decode()
    assert ("SECRET-LOCALS" in text) is shown
    assert ("<details" in text) is shown
    assert ("Tracebacks are shown to users who may change the queue." in text) is not shown
    # The error's class and text are for every viewer.
    assert "shop.errors.PaymentDown" in text
    assert "the provider said 503" in text


def test_error_texts_are_escaped_everywhere(queue: Queue) -> None:
    script = "<script>alert('x')</script>"
    message_id = bury(queue)
    plant(queue, message_id, [record(1, f"shop.{script}", script, traceback=script, worker=script)])
    client = superuser()
    for path, query in (
        (url("message", "default", message_id), {}),
        (url("detail", "default"), {"state": "garbage"}),
        (url("detail", "default"), {"state": "garbage", "error": f"shop.{script}"}),
        (url("by_error", "default"), {"action": "requeue", "error": f"shop.{script}"}),
    ):
        page = client.get(path, query).content.decode()
        assert script not in page, (path, query)
        assert html.escape(script) in page, (path, query)


def test_cut_texts_are_marked_as_cut(queue: Queue) -> None:
    message_id = bury(queue)
    plant(queue, message_id, [record(1, error="x" * 100, traceback="...last line", cut="et")])
    page = superuser().get(url("message", "default", message_id)).content.decode()
    [row] = attempts_table(page)
    assert "(cut)" in row
    assert "Traceback (its last lines; the earlier ones were cut)" in row


def test_a_huge_or_foreign_record_is_cut_on_the_page(queue: Queue) -> None:
    # Over the store's own bounds (2 KiB, 8 KiB): only a foreign write makes one.
    message_id = bury(queue)
    huge = record(
        1, "c" * 1_000_000, "e" * 1_000_000, verdict="v" * 1_000_000, traceback="t" * 1_000_000
    )
    plant(queue, message_id, [huge])
    client = superuser()
    response = client.get(url("message", "default", message_id))
    assert response.status_code == 200
    assert len(response.content) < 60_000
    [row] = attempts_table(response.content.decode())
    assert "(cut)" in row
    assert "the earlier ones were cut" in row
    # The dead letters' list, its filter's links and a chosen class's page: bounded too.
    listing = client.get(url("detail", "default") + "?state=garbage")
    assert listing.status_code == 200
    assert len(listing.content) < 60_000
    [choice] = choices(listing.content.decode())
    assert choice == "c" * 256
    chosen = client.get(url("detail", "default"), {"state": "garbage", "error": choice})
    assert message_id in chosen.content.decode()
    assert len(chosen.content) < 60_000


@pytest.mark.parametrize(
    ("raw", "damage"),
    [
        (b"{not json", "unreadable: not the JSON of attempt records"),
        (b'{"a": 1}', "unreadable: not a list of attempt records"),
        (b'["no record"]', "unreadable: not an attempt record"),
        # An older release's record, with fewer fields.
        (b'[[1, "error", "shop.Old", "its text"]]', "missing fields: 5 of 9"),
        (b'[[1, "error", 7, "text", "", "", "soon", 2]]', "a text field is not text"),
    ],
)
def test_a_damaged_record_renders_as_damaged_never_a_500(
    queue: Queue, raw: bytes, damage: str
) -> None:
    message_id = bury(queue)
    plant(queue, message_id, raw)
    client = superuser()
    response = client.get(url("message", "default", message_id))
    assert response.status_code == 200
    rows = attempts_table(response.content.decode())
    assert any("damaged record:" in row and damage in row for row in rows), rows
    listing = client.get(url("detail", "default") + "?state=garbage")
    assert listing.status_code == 200
    assert "damaged record" in listing.content.decode()


def test_a_record_not_utf8_is_shown_with_escapes(queue: Queue) -> None:
    message_id = bury(queue)
    plant(
        queue,
        message_id,
        '[[1, "error", "shop.Bad", "caf\u00e9 \xff", "", "", 1, 2, ""]]'.encode("latin-1"),
    )
    client = superuser()
    response = client.get(url("message", "default", message_id))
    assert response.status_code == 200
    [row] = attempts_table(response.content.decode())
    # Shown as damaged, with what could be read of it: never a 500.
    assert "damaged record: not UTF-8" in row, row
    assert f"shop.Bad: caf{chr(0xFFFD)} {chr(0xFFFD)}" in row, row
    assert client.get(url("detail", "default") + "?state=garbage").status_code == 200


def test_the_history_key_of_another_type_renders_as_damaged() -> None:
    queue = get_queue()
    message_id = bury(queue)
    store = redis_store(queue)
    store.client.set(store.keys.key("history"), "not a hash")
    client = superuser()
    page = client.get(url("message", "default", message_id)).content.decode()
    assert "damaged record: the history key holds a string, not a hash" in page
    listing = client.get(url("detail", "default") + "?state=garbage")
    assert listing.status_code == 200


# The dead letters: the last error column and the filter by error class


def dead_letter_ids(page: str) -> set[str]:
    return set(re.findall(r'<input type="checkbox" name="ids" value="([^"]+)"', page))


def choices(page: str) -> dict[str, str]:
    """The filter's choices: value -> "label (count)"."""
    block = re.search(r'<ul class="dq-error-choices">(.*?)</ul>', page, re.S)
    assert block is not None, "no filter"
    found = {}
    for item in re.findall(r"<li[^>]*>(.*?)</li>", block[1], re.S):
        value = re.search(r'data-dq-error="([^"]*)"', item)
        if value is not None:
            found[html.unescape(value[1])] = text_of(item)
    return found


def test_the_dead_letters_show_their_last_error_and_filter_by_its_class(queue: Queue) -> None:
    down = [bury_with(queue, PaymentDown("provider 503")) for _ in range(3)]
    bad = bury_with(queue, ValueError("bad amount " + "z" * 300))
    never = bury_bare(queue)
    client = user_with("viewer", "view_queue")

    page = client.get(url("detail", "default") + "?state=garbage").content.decode()
    assert choices(page) == {
        PAYMENT_DOWN: f"{PAYMENT_DOWN} (3)",
        "builtins.ValueError": "builtins.ValueError (1)",
        "-": "no error recorded (1)",
    }
    cells = [text_of(c) for c in re.findall(r'<td class="dq-last-error">(.*?)</td>', page, re.S)]
    assert cells.count(f"{PAYMENT_DOWN}: provider 503") == 3
    assert "no error recorded" in cells
    [cut] = [cell for cell in cells if cell.startswith("builtins.ValueError")]
    assert cut == "builtins.ValueError: bad amount " + "z" * (120 - len("bad amount ")) + "…"

    chosen = client.get(url("detail", "default") + f"?state=garbage&error={PAYMENT_DOWN}")
    shown = chosen.content.decode()
    # A viewer is shown no checkboxes: the rows' links then.
    assert all(message_id in shown for message_id in down)
    assert bad not in shown
    assert never not in shown
    assert "3 dead letter(s) whose last error is" in shown
    assert "Requeue all with this error" not in shown  # the viewer may not
    none = client.get(url("detail", "default") + "?state=garbage&error=-").content.decode()
    assert never in none
    assert all(message_id not in none for message_id in [*down, bad])


def test_the_filter_offers_the_bulk_actions_by_permission(queue: Queue) -> None:
    bury_with(queue, PaymentDown("boom"))
    path = url("detail", "default") + f"?state=garbage&error={PAYMENT_DOWN}"
    for permissions, requeue, delete in [
        (("view_queue",), False, False),
        (("change_queue",), True, False),
        (("view_queue", "delete_queue"), False, True),
    ]:
        page = user_with("u" + "".join(permissions), *permissions).get(path).content.decode()
        assert ("Requeue all with this error" in page) is requeue
        assert ("Delete all with this error" in page) is delete


def test_a_filtered_list_pages_through_its_dead_letters(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("delayqueue_django.admin.queue_pages.PAGE_SIZE", 2)
    ids = [bury_with(queue, PaymentDown("boom")) for _ in range(5)]
    for _ in range(2):
        bury_with(queue, KeyError("k"))
    client = superuser()
    seen: list[str] = []
    for page_number in (1, 2, 3):
        page = client.get(
            url("detail", "default") + f"?state=garbage&error={PAYMENT_DOWN}&page={page_number}"
        ).content.decode()
        seen += sorted(dead_letter_ids(page))
        assert f"page {page_number} of 3" in page
        if page_number < 3:
            assert f"error={PAYMENT_DOWN}&amp;page=" in page
    assert sorted(seen) == sorted(ids)


# The bulk actions by error class


def confirm(client: Client, action: str, choice: str) -> tuple[str, dict[str, str]]:
    """The confirmation page, and its form's fields."""
    response = client.get(url("by_error", "default"), {"action": action, "error": choice})
    assert response.status_code == 200
    page = response.content.decode()
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
    return page, {key: html.unescape(value) for key, value in fields.items()}


@pytest.mark.parametrize("action", ["requeue", "delete"])
def test_a_bulk_action_counts_asks_and_touches_only_the_chosen_class(
    queue: Queue, action: str
) -> None:
    down = [bury_with(queue, PaymentDown("boom")) for _ in range(3)]
    others = [bury_with(queue, ValueError("bad")), bury(queue), bury_bare(queue)]
    client = superuser()
    page, fields = confirm(client, action, PAYMENT_DOWN)
    label = "Requeue (fresh retry budget)" if action == "requeue" else "Delete"
    assert f"{label}: all 3 dead letter(s)" in text_of(page)
    assert fields["action"] == action
    assert fields["error"] == PAYMENT_DOWN
    # The page changed nothing.
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in down + others)

    time.sleep(0.005)  # (the form acts on those buried before its page was read)
    late = bury_with(queue, PaymentDown("boom"))  # buried after the page: left alone
    response = client.post(url("by_error", "default"), fields, follow=True)
    said = text_of(response.content.decode())
    did = "requeued" if action == "requeue" else "deleted"
    assert (
        f"{label}: 3 dead letter(s) of queue 'default' whose last error is "
        f"{PAYMENT_DOWN} {did}." in said
    )
    expected = ["pending"] if action == "requeue" else []
    assert all(states_of(queue, message_id) == expected for message_id in down)
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in [*others, late])


def test_the_dead_letters_without_a_record_are_a_choice_of_their_own(queue: Queue) -> None:
    recorded = bury_with(queue, PaymentDown("boom"))
    bare = [bury_bare(queue) for _ in range(2)]
    client = superuser()
    page, fields = confirm(client, "requeue", "-")
    assert "all 2 dead letter(s)" in text_of(page)
    assert "no error recorded" in text_of(page)
    time.sleep(0.005)
    client.post(url("by_error", "default"), fields)
    assert all(states_of(queue, message_id) == ["pending"] for message_id in bare)
    assert states_of(queue, recorded) == ["garbage"]


def test_a_class_no_dead_letter_has_offers_nothing_to_confirm(queue: Queue) -> None:
    bury_with(queue, PaymentDown("boom"))
    page, fields = confirm(superuser(), "delete", "builtins.KeyError")
    assert "there is nothing to delete" in text_of(page)
    assert "buried_before" not in fields


@pytest.mark.parametrize(
    ("permissions", "action", "allowed"),
    [
        (("view_queue",), "requeue", False),
        (("view_queue",), "delete", False),
        (("change_queue",), "requeue", True),
        (("change_queue",), "delete", False),
        (("view_queue", "delete_queue"), "delete", True),
        (("view_queue", "delete_queue"), "requeue", False),
    ],
)
def test_the_bulk_actions_need_their_permission(
    queue: Queue, permissions: tuple[str, ...], action: str, allowed: bool
) -> None:
    message_id = bury_with(queue, PaymentDown("boom"))
    client = user_with("someone", *permissions)
    shown = client.get(url("by_error", "default"), {"action": action, "error": PAYMENT_DOWN})
    assert shown.status_code == (200 if allowed else 403)
    time.sleep(0.005)
    data = {
        "action": action,
        "error": PAYMENT_DOWN,
        "buried_before": str(queue.stats()["server_time_ms"]),
    }
    response = client.post(url("by_error", "default"), data)
    assert response.status_code == (302 if allowed else 403)
    moved = {"requeue": ["pending"], "delete": []}[action]
    assert states_of(queue, message_id) == (moved if allowed else ["garbage"])


def test_the_bulk_action_is_protected_against_csrf(queue: Queue) -> None:
    message_id = bury_with(queue, PaymentDown("boom"))
    client = superuser(enforce_csrf_checks=True)
    _, fields = confirm(client, "delete", PAYMENT_DOWN)
    without = {key: value for key, value in fields.items() if key != "csrfmiddlewaretoken"}
    time.sleep(0.005)
    assert client.post(url("by_error", "default"), without).status_code == 403
    assert states_of(queue, message_id) == ["garbage"]
    token = re.search(
        r'name="csrfmiddlewaretoken" value="([^"]+)"',
        client.get(
            url("by_error", "default"), {"action": "delete", "error": PAYMENT_DOWN}
        ).content.decode(),
    )
    assert token is not None
    response = client.post(url("by_error", "default"), {**without, "csrfmiddlewaretoken": token[1]})
    assert response.status_code == 302
    assert states_of(queue, message_id) == []


def test_a_bulk_action_without_a_time_or_a_choice_changes_nothing(queue: Queue) -> None:
    message_id = bury_with(queue, PaymentDown("boom"))
    client = superuser()
    for data in (
        {"action": "requeue", "error": PAYMENT_DOWN},
        {"action": "requeue", "error": PAYMENT_DOWN, "buried_before": "soon"},
        {"action": "requeue", "buried_before": "1"},
        {"action": "shred", "error": PAYMENT_DOWN, "buried_before": "1"},
    ):
        response = client.post(url("by_error", "default"), data, follow=True)
        assert response.status_code == 200
        assert states_of(queue, message_id) == ["garbage"]


def test_a_bulk_action_goes_in_batches_and_stops_at_its_limit(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of 3, at most 7 read a request: the class's dead letters interleaved with
    # others, so that the batches' offsets must skip what was requeued.
    monkeypatch.setattr(error_classes, "BATCH", 3)
    monkeypatch.setattr(error_actions, "ACTION_LIMIT", 7)
    down, others = [], []
    for n in range(5):
        down.append(bury_with(queue, PaymentDown("boom")))
        if n % 2:
            others.append(bury_with(queue, ValueError("bad")))
    client = superuser()
    page, fields = confirm(client, "requeue", PAYMENT_DOWN)
    assert "at least 5 dead letter(s)" in text_of(page)
    time.sleep(0.005)
    said = text_of(client.post(url("by_error", "default"), fields, follow=True).content.decode())
    assert "5 dead letter(s) of queue 'default'" in said
    assert "It stopped after reading 7 dead letters: take the action again" in said
    assert all(states_of(queue, message_id) == ["pending"] for message_id in down)
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in others)


# Sharded queues: every shard is read, each with its own offsets


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_the_filter_and_the_bulk_action_cover_every_shard(
    configure: Callable[..., Queue], backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(error_classes, "BATCH", 2)
    queue = configure()
    down = [bury_with(queue, PaymentDown("boom")) for _ in range(12)]
    others = [bury_with(queue, ValueError("bad")) for _ in range(5)]
    store = queue.store
    assert isinstance(store, ShardedStore)
    assert len({store.shard_for(message_id) for message_id in down}) > 1

    client = superuser()
    page = client.get(url("detail", "default") + "?state=garbage").content.decode()
    assert choices(page)[PAYMENT_DOWN] == f"{PAYMENT_DOWN} (12)"
    chosen = client.get(
        url("detail", "default") + f"?state=garbage&error={PAYMENT_DOWN}"
    ).content.decode()
    assert dead_letter_ids(chosen) == set(down)

    page, fields = confirm(client, "requeue", PAYMENT_DOWN)
    assert "all 12 dead letter(s)" in text_of(page)
    time.sleep(0.005)
    said = text_of(client.post(url("by_error", "default"), fields, follow=True).content.decode())
    assert "12 dead letter(s) of queue 'default'" in said
    assert all(states_of(queue, message_id) == ["pending"] for message_id in down)
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in others)


# Redis down, a shard down, and the filter's bound


def test_redis_down_gives_the_pages_of_failures_a_clear_page_not_a_500(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}
    }
    client = superuser()
    response = client.get(url("detail", "default") + f"?state=garbage&error={PAYMENT_DOWN}")
    assert response.status_code == 503
    response = client.get(url("message", "default", "some-id"))
    assert response.status_code == 503
    shown = client.get(url("by_error", "default"), {"action": "requeue", "error": PAYMENT_DOWN})
    assert shown.status_code == 200
    assert "Redis is unavailable for queue" in shown.content.decode()
    assert "buried_before" not in shown.content.decode()  # nothing to confirm
    response = client.post(
        url("by_error", "default"),
        {"action": "requeue", "error": PAYMENT_DOWN, "buried_before": "1"},
        follow=True,
    )
    page = response.content.decode()
    said = text_of(page)
    assert "0 dead letter(s) of queue 'default'" in said
    assert "Then Redis could not be reached, and it stopped" in said
    assert '<li class="error">' in page  # an error, not a success


def test_the_filter_reads_a_bounded_number_of_dead_letters_and_says_so(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("delayqueue_django.admin.queue_pages.FILTER_LIMIT", 4)
    monkeypatch.setattr(error_classes, "BATCH", 3)
    for _ in range(6):
        bury_with(queue, PaymentDown("boom"))
    page = superuser().get(url("detail", "default") + "?state=garbage").content.decode()
    assert "counted over the first 4 dead letters read" in text_of(page)
    assert choices(page) == {PAYMENT_DOWN: f"{PAYMENT_DOWN} (4)"}
    assert 'data-dq-stat="garbage">6<' in page
