"""The admin pages: permissions, CSRF, actions, escaping, Redis down, a million messages."""

import html
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.admin.display import INDENTED_CHARS, MESSAGE_PAYLOAD_BYTES
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage, printable
from delayqueue_django.engine.records import ScheduleFailure
from delayqueue_django.engine.sharding import layouts as shard_layouts
from delayqueue_django.engine.sharding.placement import slot_of
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.schedules.definition import Schedule
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.worker import heartbeat
from tests.backends import SHARDED_BACKENDS
from tests.conftest import MEMORY_URL, queue_settings
from tests.helpers import fetch_when_due, redis_store, send_what_reaches_redis, states_of
from tests.redis_servers import RedisClusterServers

pytestmark = pytest.mark.django_db

PACKAGE_STATIC = (
    Path(__file__).resolve().parent.parent / "delayqueue_django/static/delayqueue_django"
)


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def make_user(name: str, *permissions: str, superuser: bool = False) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True, is_superuser=superuser)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="delayqueue_django", codename=codename)
        )
    return user


def client_for(user: User | None, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


def bury(queue: Queue, payload: Any = "dead") -> str:
    message_id = queue.send(payload, retry_count=0)
    [message] = [m for m in fetch_when_due(queue) if m.id == message_id]
    queue.nack([message])
    return message_id


@pytest.fixture
def queue() -> Queue:
    return get_queue()


@pytest.fixture
def users() -> dict[str, User | None]:
    return {
        "anonymous": None,
        "staff": make_user("staff"),
        "viewer": make_user("viewer", "view_queue"),
        "changer": make_user("changer", "view_queue", "change_queue"),
        "deleter": make_user("deleter", "view_queue", "delete_queue"),
        "superuser": make_user("root", superuser=True),
    }


def test_the_queues_have_an_entry_in_the_admin_for_those_who_may_view_them(
    users: dict[str, User | None],
) -> None:
    page = client_for(users["viewer"]).get(reverse("admin:index")).content.decode()
    assert "Delay queues" in page
    assert url("changelist") in page
    page = client_for(users["staff"]).get(reverse("admin:index")).content.decode()
    assert url("changelist") not in page


def viewing_paths(message_id: str) -> list[str]:
    """Every page and JSON view that shows the queue, none of them changing it."""
    return [
        url("changelist"),
        url("detail", "default"),
        url("message", "default", message_id),
        url("payload", "default", message_id),
        url("json"),
        url("queue_json", "default"),
    ]


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("anonymous", 302),
        ("staff", 403),
        ("viewer", 200),
        ("changer", 200),
        ("deleter", 200),
        ("superuser", 200),
    ],
)
def test_viewing_needs_the_view_permission(
    users: dict[str, User | None], queue: Queue, user: str, expected: int
) -> None:
    message_id = queue.send({"n": 1}, delay=60)
    client = client_for(users[user])
    for path in viewing_paths(message_id):
        response = client.get(path)
        assert response.status_code == expected, path
        if expected == 302:
            assert response["Location"].startswith(reverse("admin:login"))


@pytest.mark.parametrize(
    ("user", "action", "allowed"),
    [
        ("viewer", "requeue", False),
        ("viewer", "delete", False),
        ("changer", "requeue", True),
        ("changer", "delete", False),
        ("deleter", "requeue", False),
        ("deleter", "delete", True),
        ("superuser", "requeue", True),
        ("superuser", "delete", True),
        ("staff", "requeue", False),
    ],
)
def test_actions_need_the_change_or_delete_permission(
    users: dict[str, User | None], queue: Queue, user: str, action: str, allowed: bool
) -> None:
    message_id = bury(queue)
    response = client_for(users[user]).post(
        url("action", "default"), {"action": action, "ids": [message_id], "state": "garbage"}
    )
    assert response.status_code == (302 if allowed else 403)
    assert (states_of(queue, message_id) == ["garbage"]) is not allowed


def test_purge_needs_the_delete_permission(users: dict[str, User | None], queue: Queue) -> None:
    bury(queue)
    assert client_for(users["changer"]).post(url("purge", "default")).status_code == 403
    assert client_for(users["changer"]).get(url("purge", "default")).status_code == 403
    assert queue.stats()["garbage"] == 1


def test_anonymous_actions_go_to_the_login_page(queue: Queue) -> None:
    message_id = bury(queue)
    response = Client().post(url("action", "default"), {"action": "delete", "ids": [message_id]})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert states_of(queue, message_id) == ["garbage"]


def csrf_token(client: Client, path: str) -> str:
    page = client.get(path).content.decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("action", ["requeue", "deliver_now", "delete", "purge"])
def test_every_action_is_protected_against_csrf(
    users: dict[str, User | None], queue: Queue, action: str
) -> None:
    later = action == "deliver_now"
    message_id = queue.send("later", delay=3600) if later else bury(queue)
    before = queue.peek(message_id)
    client = client_for(users["superuser"], enforce_csrf_checks=True)
    path = url("purge", "default") if action == "purge" else url("action", "default")
    state = "pending" if later else "garbage"
    data = (
        {"buried_before": str(queue.stats()["server_time_ms"] + 1)}
        if action == "purge"
        else {"action": action, "ids": [message_id], "state": state}
    )

    assert client.post(path, data).status_code == 403
    assert queue.peek(message_id) == before

    page = url("purge", "default") if action == "purge" else url("detail", "default")
    token = csrf_token(client, f"{page}?state={state}")
    assert client.post(path, {**data, "csrfmiddlewaretoken": token}).status_code == 302
    assert queue.peek(message_id) != before


def test_actions_are_get_proof(users: dict[str, User | None], queue: Queue) -> None:
    message_id = bury(queue)
    response = client_for(users["superuser"]).get(
        url("action", "default"), {"action": "delete", "ids": message_id}
    )
    assert response.status_code == 405
    assert states_of(queue, message_id) == ["garbage"]


def test_requeue_moves_dead_letters_back_and_says_so(
    users: dict[str, User | None], queue: Queue
) -> None:
    first, second = bury(queue), bury(queue)
    client = client_for(users["superuser"])
    response = client.post(
        url("action", "default"),
        {"action": "requeue", "ids": [first, second, "unknown"]},
        follow=True,
    )
    assert "Requeue (fresh retry budget): 2 of 3 message(s) in queue" in response.content.decode()
    assert states_of(queue, first) == ["pending"]
    assert states_of(queue, second) == ["pending"]


def test_deliver_now_and_delete(users: dict[str, User | None], queue: Queue) -> None:
    later = queue.send({"n": 1}, delay=3600)
    client = client_for(users["superuser"])
    client.post(url("action", "default"), {"action": "deliver_now", "ids": [later]})
    [message] = fetch_when_due(queue)
    assert message.id == later

    doomed = queue.send({"n": 2}, delay=3600)
    response = client.post(
        url("action", "default"),
        {"action": "delete", "ids": [doomed], "state": "pending"},
        follow=True,
    )
    assert "Delete: 1 of 1 message(s)" in response.content.decode()
    assert queue.peek(doomed) is None


def test_purge_asks_first_then_deletes_every_dead_letter(
    users: dict[str, User | None], queue: Queue
) -> None:
    for _ in range(3):
        bury(queue)
    time.sleep(0.005)  # (a burial in the millisecond the page reads is kept)
    client = client_for(users["deleter"])
    page = client.get(url("purge", "default")).content.decode()
    assert "Delete all 3 dead letter(s)" in page
    found = re.search(r'name="buried_before" value="(\d+)"', page)
    assert found is not None
    response = client.post(url("purge", "default"), {"buried_before": found.group(1)}, follow=True)
    assert "Purged 3 dead letter(s)" in response.content.decode()
    assert queue.stats()["garbage"] == 0


def test_actions_are_logged(
    users: dict[str, User | None], queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    message_id = bury(queue)
    with caplog.at_level("INFO", logger="delayqueue_django.admin"):
        client_for(users["superuser"]).post(
            url("action", "default"), {"action": "requeue", "ids": [message_id]}
        )
    assert f"admin action=requeue queue=default user=root ids={message_id} done=1" in caplog.text


# What a posted id or schedule name would add to forge a log record of its own after it.
FORGED = "\n2024-05-06 12:00:00,000 INFO delayqueue_django.admin: admin action=purge"


def test_a_posted_id_or_schedule_name_cannot_forge_a_log_line(
    users: dict[str, User | None], queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    message_id = bury(queue)
    # A schedule of that name can only be a foreign write: the API refuses such names.
    schedule = Schedule("poll" + FORGED, None, 300_000, "UTC", "1", source="api")
    queue.store.define_schedule(
        schedule.name,
        schedule.to_json(),
        schedule.fingerprint,
        expect="new",
        start_ms=0,
        first=None,
    )
    client = client_for(users["superuser"])
    with caplog.at_level("INFO", logger="delayqueue_django.admin"):
        client.post(url("action", "default"), {"action": "requeue", "ids": [message_id + FORGED]})
        client.post(url("schedule_action", "default"), {"name": schedule.name, "action": "pause"})
    assert queue.schedules.get(schedule.name).paused
    lines = [record.getMessage() for record in caplog.records]
    escaped = FORGED.replace("\n", "\\n")
    assert lines == [
        f"admin action=requeue queue=default user=root ids={message_id}{escaped} done=0",
        f"admin action=schedule-pause queue=default user=root schedule=poll{escaped}",
    ]
    assert len(caplog.text.splitlines()) == 2


def test_an_unknown_action_or_no_selection_changes_nothing(
    users: dict[str, User | None], queue: Queue
) -> None:
    message_id = bury(queue)
    client = client_for(users["superuser"])
    page = client.post(
        url("action", "default"), {"action": "explode", "ids": [message_id]}, follow=True
    )
    assert "Choose an action." in page.content.decode()
    page = client.post(
        url("action", "default"), {"action": "delete", "state": "garbage"}, follow=True
    )
    assert "No messages were selected." in page.content.decode()
    assert states_of(queue, message_id) == ["garbage"]


def test_an_outside_next_url_is_not_followed(users: dict[str, User | None], queue: Queue) -> None:
    message_id = bury(queue)
    response = client_for(users["superuser"]).post(
        url("action", "default"),
        {"action": "requeue", "ids": [message_id], "next": "https://evil.example/"},
    )
    assert response["Location"] == url("detail", "default")


XSS = '<script>alert("pwned")</script>'


def test_payloads_are_shown_escaped(users: dict[str, User | None], queue: Queue) -> None:
    message_id = queue.send({"name": XSS, XSS: 1}, delay=60)
    client = client_for(users["viewer"])
    for path in (url("detail", "default"), url("message", "default", message_id)):
        page = client.get(path).content.decode()
        assert XSS not in page
        assert "&lt;script&gt;alert(" in page


def test_the_queue_page_shows_counts_workers_throughput_and_messages(
    users: dict[str, User | None], queue: Queue
) -> None:
    queue.send({"order": 42}, delay=60)
    bury(queue)
    heartbeat.beat(
        queue,
        "host:1:abc",
        {
            "host": "worker-host",
            "pid": 4242,
            "queues": ["default"],
            "concurrency": 2,
            "handled": 7,
            "failed": 1,
            "started": 1.0,
            "last_seen": 2.0,
        },
        ttl_seconds=30,
    )
    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    assert 'data-dq-stat="pending">1<' in page
    assert 'data-dq-stat="garbage">1<' in page
    assert "worker-host" in page
    assert "4242" in page
    assert "0 acked ·" in page
    assert "1 failed (refused or timed out)" in page
    assert "max consume 30 s" in page
    assert "{&quot;order&quot;:42}" in page
    assert 'name="ids"' not in page  # a viewer gets no action checkboxes


def test_the_worker_table_shows_the_running_handlers_and_their_age(
    users: dict[str, User | None], queue: Queue
) -> None:
    running = [
        {"id": "hung-one", "queue": "default", "attempt": 2, "age": 95.5, "past_deadline": True},
        {"id": "<b>new</b>", "queue": "other", "attempt": 1, "age": 0.3, "past_deadline": False},
    ]
    heartbeat.beat(queue, "busy", {"host": "busy-host", "running": running}, ttl_seconds=30)
    heartbeat.beat(queue, "idle", {"host": "idle-host", "running": []}, ttl_seconds=30)
    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    assert "Running at last seen" in page
    assert "hung-one (default, attempt 2) for 95.5 s, past its deadline<br>" in page
    assert "&lt;b&gt;new&lt;/b&gt; (other, attempt 1) for 0.3 s</td>" in page
    assert re.search(r"idle-host</td>.*?<td>—</td></tr>", page, re.DOTALL)


def test_the_worker_table_tells_a_supervisor_from_its_worker_processes(
    users: dict[str, User | None], queue: Queue
) -> None:
    supervisor = {"role": "supervisor", "host": "h", "pid": 10, "processes": 2, "restarts": 1}
    heartbeat.beat(queue, "sup", supervisor, ttl_seconds=30)
    heartbeat.beat(queue, "child", {"host": "h", "pid": 11, "supervisor": 10}, ttl_seconds=30)
    heartbeat.beat(queue, "alone", {"host": "h", "pid": 12, "supervisor": None}, ttl_seconds=30)
    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    assert "<th>Process</th>" in page
    assert "<td>10</td>\n      <td>supervisor of 2, 1 restart</td>" in page
    assert "<td>11</td>\n      <td>under 10</td>" in page
    assert "<td>12</td>\n      <td>worker</td>" in page


def test_times_are_shown_to_the_second(users: dict[str, User | None], queue: Queue) -> None:
    due = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    message_id = queue.send("later", at=due)
    bury(queue)
    heartbeat.beat(queue, "w", {"host": "h", "started": 1.0, "last_seen": 62.0}, ttl_seconds=30)
    client = client_for(users["viewer"])
    queue_page = client.get(url("detail", "default")).content.decode()
    assert "Next due: 2030-01-02 03:04:05 UTC" in queue_page
    assert "<td>2030-01-02 03:04:05 UTC</td>" in queue_page  # the pending list
    assert "<td>1970-01-01 00:00:01 UTC</td><td>1970-01-01 00:01:02 UTC</td>" in queue_page
    garbage = client.get(url("detail", "default") + "?state=garbage").content.decode()
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", garbage)  # buried
    message_page = client.get(url("message", "default", message_id)).content.decode()
    assert "<th>Due</th><td>2030-01-02 03:04:05 UTC</td>" in message_page
    overview = client.get(url("changelist")).content.decode()
    assert "<td>2030-01-02 03:04:05 UTC</td>" in overview


# A time as the admin shows every one: to the second, with its zone.
SHOWN_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_the_schedules_times_are_shown_as_every_other_time(
    users: dict[str, User | None], queue: Queue
) -> None:
    """Before, the schedules table alone used Django's default format, with no zone
    ("May 6, 2030, 3:04 a.m.") beside the page's "2030-05-06 03:04:05 UTC"."""
    info = queue.schedules.add("poll", every=300, payload=1)
    assert info.schedule is not None
    assert info.next_run is not None
    ScheduleRunner(queue).run_due(round(info.next_run.timestamp() * 1000) + 1)
    since = datetime(2030, 5, 6, 3, 4, 5, tzinfo=UTC)
    failure = ScheduleFailure("RuntimeError: down", round(since.timestamp() * 1000))
    queue.store.report_schedule_failure("poll", info.schedule.fingerprint, failure)
    ran = queue.schedules.get("poll")
    assert ran.last_run is not None
    assert ran.next_run is not None

    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    row = page[page.index("<td>poll</td>") :]
    row = row[: row.index("</tr>")]
    assert f"<td>{ran.last_run:%Y-%m-%d %H:%M:%S} UTC</td>" in row
    assert f">{ran.next_run:%Y-%m-%d %H:%M:%S} UTC</a></td>" in row
    assert "failing since 2030-05-06 03:04:05 UTC: RuntimeError: down" in row
    assert not re.search(r"\b[ap]\.m\.", page)  # nowhere Django's default format
    # The throughput bars' tooltips: each minute with its zone.
    assert re.search(r'class="dq-bar" title="\d\d:\d\d UTC:', page)


def test_the_message_pages_buttons_are_labelled(
    users: dict[str, User | None], queue: Queue
) -> None:
    """Before, Delete had the admin's deletelink class, meant for links: on a button it
    put the icon in place of the button's colour, and its white label vanished."""
    message_id = queue.send("later", delay=3600)
    page = client_for(users["superuser"]).get(url("message", "default", message_id))
    buttons = re.findall(
        r'<button type="submit" class="([^"]*)">([^<]*)</button>', page.content.decode()
    )
    assert buttons == [
        ("button", "Deliver now"),
        ("button", "Reschedule…"),
        ("button dq-delete", "Delete"),
    ]
    css = (PACKAGE_STATIC / "admin.css").read_text()
    rule = re.search(r"\.button\.dq-delete \{([^}]*)\}", css)
    assert rule is not None
    assert "background: var(--delete-button-bg)" in rule.group(1)
    assert "color: var(--button-fg)" in rule.group(1)


def test_the_json_view_gives_the_counts(users: dict[str, User | None], queue: Queue) -> None:
    queue.send("x", delay=60)
    bury(queue)
    data = client_for(users["viewer"]).get(url("queue_json", "default")).json()
    assert data["ok"] is True
    assert (data["pending"], data["garbage"], data["workers"]) == (1, 1, 0)
    every = client_for(users["viewer"]).get(url("json")).json()
    assert set(every["queues"]) == {"default", "other"}


def test_unknown_queues_and_messages_are_404(users: dict[str, User | None]) -> None:
    client = client_for(users["viewer"])
    assert client.get(url("detail", "nope")).status_code == 404
    assert client.get(url("message", "default", "nope")).status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "state=<script>",
        "state=garbage&page=-5",
        "page=abc",
        "page=99999999999999999999999",
        "state=&page=",
    ],
)
def test_odd_query_parameters_never_break_the_page(
    users: dict[str, User | None], queue: Queue, query: str
) -> None:
    queue.send("x", delay=60)
    response = client_for(users["viewer"]).get(url("detail", "default") + "?" + query)
    assert response.status_code == 200
    assert "<script>" not in response.content.decode().split("<body")[1].replace("<script src", "")


def test_redis_down_gives_a_clear_page_not_a_500(
    users: dict[str, User | None], settings: Any
) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}
    }
    client = client_for(users["superuser"])
    response = client.get(url("detail", "default"))
    assert response.status_code == 503
    assert "Redis is unavailable for queue" in response.content.decode()
    overview = client.get(url("changelist"))
    assert overview.status_code == 200
    assert "Redis is unavailable" in overview.content.decode()
    assert client.get(url("queue_json", "default")).json()["ok"] is False
    response = client.post(
        url("action", "default"), {"action": "delete", "ids": ["x"]}, follow=True
    )
    assert "Redis is unavailable for queue" in response.content.decode()


FILL = """
local pending, payloads, metas = KEYS[1], KEYS[2], KEYS[3]
local first, count, due = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = first, first + count - 1 do
  local id = 'm' .. i
  redis.call('ZADD', pending, due, id)
  redis.call('HSET', payloads, id, '{"n":' .. i .. '}')
  redis.call('HSET', metas, id, '0:0:3')
end
"""


def count_round_trips(queue: Queue, fetch: Callable[[], Any]) -> int:
    client: Any = redis_store(queue).client
    calls = 0
    original = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    client.execute_command = counting
    try:
        fetch()
    finally:
        del client.execute_command
    return calls


@pytest.mark.slow
def test_a_million_pending_messages_cost_the_page_no_more_round_trips(
    users: dict[str, User | None], queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The register of layouts is read once (by the first page), not again as every 10 s.
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 3600.0)
    client = client_for(users["superuser"])
    queue.send("warm up", delay=3600)
    path = url("detail", "default")
    client.get(path)  # once: the version check and loading the scripts are one-time costs
    small = count_round_trips(queue, lambda: client.get(path))

    keys = queue.store.keys
    # The fill is setup, not what is measured: its client waits for each 100,000-message
    # call's reply however long a loaded machine takes (the queue's 5 s socket timeout once
    # cut one short).
    store_client = redis_store(queue).client
    assert isinstance(store_client, redis.Redis)  # the default queue: the standalone server
    options = store_client.connection_pool.connection_kwargs
    filler = redis.Redis(host=options["host"], port=options["port"], db=options.get("db", 0))
    fill = filler.register_script(FILL)
    for first in range(0, 1_000_000, 100_000):
        fill(
            keys=[keys.key("pending"), keys.key("payload"), keys.key("meta")],
            args=[first, 100_000, 4102444800000],
        )
    filler.close()
    assert queue.stats()["pending"] == 1_000_001

    big = count_round_trips(queue, lambda: client.get(path))
    last_page = count_round_trips(queue, lambda: client.get(path + "?page=20001"))
    page = client.get(path + "?page=20001").content.decode()
    assert big == small == last_page
    # Stats, one page of messages, throughput, the metrics history, the workers index, the
    # schedules, the flow gates' state.
    assert big == 7
    assert "page 20001 of 20001" in page
    assert 'data-dq-stat="pending">1000001<' in client.get(path).content.decode()


def test_an_unknown_action_does_not_follow_an_outside_next_url(
    users: dict[str, User | None], queue: Queue
) -> None:
    response = client_for(users["superuser"]).post(
        url("action", "default"), {"action": "explode", "next": "https://evil.example/"}
    )
    assert response["Location"] == url("detail", "default")


def test_pages_have_breadcrumbs_back_to_the_queues(
    users: dict[str, User | None], queue: Queue
) -> None:
    message_id = queue.send("x", delay=60)
    client = client_for(users["superuser"])
    for path in (
        url("detail", "default"),
        url("message", "default", message_id),
        url("purge", "default"),
    ):
        page = client.get(path).content.decode()
        assert f'&rsaquo; <a href="{url("changelist")}">Queues</a>' in page, path


def test_the_admin_works_on_a_memory_queue(users: dict[str, User | None], settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    queue = get_queue()
    later = queue.send({"order": 42}, delay=60)
    dead = bury(queue)
    heartbeat.beat(queue, "host:1:abc", {"host": "worker-host", "pid": 4242}, ttl_seconds=30)
    client = client_for(users["superuser"])

    assert 'data-dq-stat="pending">1<' in client.get(url("changelist")).content.decode()
    page = client.get(url("detail", "default")).content.decode()
    assert 'data-dq-stat="garbage">1<' in page
    assert "worker-host" in page
    assert "&quot;order&quot;: 42" in client.get(url("message", "default", later)).content.decode()
    response = client.post(
        url("action", "default"), {"action": "requeue", "ids": [dead]}, follow=True
    )
    assert "Requeue (fresh retry budget): 1 of 1 message(s) in queue" in response.content.decode()
    assert states_of(queue, dead) == ["pending"]
    data = client.get(url("queue_json", "default")).json()
    assert (data["ok"], data["pending"], data["garbage"], data["workers"]) == (True, 2, 0, 1)


def test_the_queue_page_lists_the_schedules_and_pauses_and_resumes_them(
    users: dict[str, User | None], queue: Queue
) -> None:
    queue.schedules.add("poll", every=300, payload={"<b>": "x"})
    queue.schedules.add("report", cron="0 3 * * *", time_zone="Europe/Berlin", missed="skip")
    queue.schedules.add("sync", every=60, missed="all", missed_limit=20)
    path = url("detail", "default")

    page = client_for(users["viewer"]).get(path).content.decode()
    assert "<h2>Schedules</h2>" in page
    assert "every 300 s" in page
    assert "cron 0 3 * * * (Europe/Berlin)" in page
    assert "skip, after 60 s" in page
    assert "all, after 60 s, the latest 20" in page
    # The payload is escaped.
    assert "&lt;b&gt;" in page
    assert "<b>" not in page
    next_id = queue.schedules.get("poll").next_id
    assert next_id is not None
    assert url("message", "default", next_id) in page
    assert 'value="pause"' not in page  # viewing only

    action = url("schedule_action", "default")
    assert (
        client_for(users["viewer"]).post(action, {"name": "poll", "action": "pause"}).status_code
        == 403
    )
    assert client_for(users["changer"]).get(action).status_code == 405
    csrf_checked = client_for(users["changer"], enforce_csrf_checks=True)
    assert csrf_checked.post(action, {"name": "poll", "action": "pause"}).status_code == 403
    assert not queue.schedules.get("poll").paused

    changer = client_for(users["changer"])
    assert 'value="pause"' in changer.get(path).content.decode()
    response = changer.post(action, {"name": "poll", "action": "pause"}, follow=True)
    assert (
        "Schedule &#x27;poll&#x27; of queue &#x27;default&#x27; paused."
        in response.content.decode()
    )
    assert queue.schedules.get("poll").paused
    assert 'value="resume"' in response.content.decode()
    response = changer.post(action, {"name": "poll", "action": "resume"}, follow=True)
    assert "resumed." in response.content.decode()
    assert not queue.schedules.get("poll").paused
    response = changer.post(action, {"name": "gone", "action": "pause"}, follow=True)
    assert "has no schedule named &#x27;gone&#x27;" in response.content.decode()


def test_the_queue_page_shows_a_failing_schedule_and_why(
    users: dict[str, User | None], queue: Queue
) -> None:
    info = queue.schedules.add("poll", every=300, payload=1)
    assert info.schedule is not None
    since = datetime(2024, 5, 6, 12, tzinfo=UTC)
    failure = ScheduleFailure("RuntimeError: <no> payload", round(since.timestamp() * 1000))
    reply = queue.store.report_schedule_failure("poll", info.schedule.fingerprint, failure)
    assert reply.status == "failed"
    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    assert 'class="dq-error">failing since 2024-05-06 12:00:00 UTC' in page
    assert "RuntimeError: &lt;no&gt; payload" in page


def test_a_schedule_whose_definition_cannot_be_read_is_listed_and_can_be_removed(
    users: dict[str, User | None], queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    queue.schedules.add("healthy", every=300, payload=1)
    # Written by a foreign client: no definition at all, under a name in UTF-8 and under
    # one whose bytes are not (it cannot travel in a form: it is shown, without a button).
    store = redis_store(queue)
    store.client.hset(store.keys.key("schedules"), "broken", b"\xff\xfe{garbage")
    store.client.hset(store.keys.key("schedules"), b"bytes-\xfe", b"[")
    path = url("detail", "default")

    page = client_for(users["viewer"]).get(path).content.decode()
    assert "<td>broken</td>" in page
    assert "<td>bytes-\\xfe</td>" in page
    assert (
        'class="dq-error">unreadable: schedule &#x27;broken&#x27; has an unreadable definition: '
        "Expecting value" in page
    )
    assert 'value="remove"' not in page  # viewing only
    page = client_for(users["changer"]).get(path).content.decode()
    assert 'value="remove"' not in page
    # The healthy schedule's, and the queue's own (its Flow section).
    assert page.count('value="pause"') == 2
    page = client_for(users["deleter"]).get(path).content.decode()
    assert page.count('value="remove"') == 1
    assert 'name="name" value="broken"' in page

    action = url("schedule_action", "default")
    assert (
        client_for(users["changer"])
        .post(action, {"name": "broken", "action": "remove"})
        .status_code
        == 403
    )
    deleter = client_for(users["deleter"])
    assert deleter.post(action, {"name": "healthy", "action": "pause"}).status_code == 403
    response = deleter.post(action, {"name": "healthy", "action": "remove"}, follow=True)
    assert "Schedule &#x27;healthy&#x27; of queue &#x27;default&#x27; can be read" in (
        response.content.decode()
    )
    with caplog.at_level("INFO", logger="delayqueue_django.admin"):
        response = deleter.post(action, {"name": "broken", "action": "remove"}, follow=True)
    assert "Schedule &#x27;broken&#x27; of queue &#x27;default&#x27; removed." in (
        response.content.decode()
    )
    assert "admin action=schedule-remove queue=default user=deleter schedule=broken" in caplog.text
    assert [printable(info.name) for info in queue.schedules.all()] == ["bytes-\\xfe", "healthy"]


def test_a_queue_without_schedules_says_how_to_add_them(
    users: dict[str, User | None], queue: Queue
) -> None:
    page = client_for(users["viewer"]).get(url("detail", "default")).content.decode()
    assert "No schedule. Declare them in <code>SCHEDULES</code>" in page


# A sharded queue (SHARDS): each shard under the totals


def shard_rows(page: str) -> dict[str, str]:
    """The queue page's table of shards: each row's HTML, by shard name."""
    return dict(re.findall(r'<tr data-dq-shard="([^"]+)"[^>]*>(.*?)</tr>', page, re.DOTALL))


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_a_sharded_queue_page_shows_each_shard_under_the_unchanged_totals(
    users: dict[str, User | None], configure: Callable[..., Queue], backend_url: str
) -> None:
    queue = configure()
    for n in range(30):
        queue.send({"n": n}, delay=60)
    bury(queue)
    stores = parts(queue.store)
    totals = queue.stats()
    client = client_for(users["viewer"])

    page = client.get(url("detail", "default")).content.decode()
    rows = shard_rows(page)
    assert list(rows) == list(stores)
    assert f'data-dq-stat="pending">{totals["pending"]}<' in page
    assert 'data-dq-stat="garbage">1<' in page
    on_cluster = "cluster" in backend_url
    for name, store in stores.items():
        stats = store.stats()
        row = rows[name]
        assert f"<th>{name}</th><td><code>{store.keys.tag}</code></td>" in row
        for count in ("pending", "ready", "unack", "retry", "garbage"):
            assert f'<td data-dq-shard-stat="{count}">{stats[count]}</td>' in row
        assert f'data-dq-shard-stat="lag_ms">{stats["lag_ms"]}<' in row
        assert (f"<td>{slot_of(store.keys)}</td>" in row) is on_cluster
    assert ("<th>Slot</th><th>Server</th>" in page) is on_cluster
    assert sum(store.stats()["pending"] for store in stores.values()) == totals["pending"] == 30

    overview = client.get(url("changelist")).content.decode()
    assert f"({len(stores)} shards)" in overview
    assert f'data-dq-stat="pending">{totals["pending"]}<' in overview


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_the_json_views_give_each_shard_of_a_sharded_queue(
    users: dict[str, User | None], configure: Callable[..., Queue], backend_url: str
) -> None:
    queue = configure()
    for n in range(20):
        queue.send({"n": n}, delay=60)
    stores = parts(queue.store)
    client = client_for(users["viewer"])

    data = client.get(url("queue_json", "default")).json()
    shards = data.pop("shards")
    assert data.pop("workers") == 0
    assert data.pop("ok") is True
    for key in ("outbox", "outbox_age_ms", "server_time_ms", "lag_ms"):
        data.pop(key)
    expected = queue.stats()
    for key in ("server_time_ms", "lag_ms"):
        expected.pop(key)
    assert data == expected  # the totals, as before
    assert list(shards) == list(stores)
    for name, store in stores.items():
        shard = shards[name]
        assert (shard["ok"], shard["tag"]) == (True, store.keys.tag)
        assert shard["pending"] == store.stats()["pending"]
        if "cluster" in backend_url:
            assert shard["slot"] == slot_of(store.keys)
            assert re.fullmatch(r"127\.0\.0\.1:\d+", shard["server"])
        else:
            assert shard["slot"] is shard["server"] is None
    assert sum(shard["pending"] for shard in shards.values()) == 20

    every = client.get(url("json")).json()["queues"]
    assert set(every["default"]["shards"]) == set(stores)
    assert "shards" not in every["other"]  # an unsharded queue's report is as it was


@pytest.mark.cluster
def test_a_shard_that_cannot_be_reached_leaves_a_page_of_the_others_figures_marked_partial(
    users: dict[str, User | None],
    shards_down: list[str],
    cluster_missing_a_master: RedisClusterServers,
) -> None:
    queue = get_queue()
    sent = send_what_reaches_redis(queue, 12)
    client = client_for(users["viewer"])
    names = ", ".join(shards_down)
    [port] = {
        cluster_missing_a_master.master_for(store.keys.tag).port
        for name, store in parts(queue.store).items()
        if name in shards_down
    }
    warning = (
        f"queue &#x27;default&#x27; cannot reach Redis for shard(s) {names} "
        f"(on 127.0.0.1:{port}): Error "
    )

    response = client.get(url("detail", "default"))
    assert response.status_code == 200
    page = response.content.decode()
    assert (
        '<p class="errornote dq-partial">The figures on this page leave out 2 shard(s), marked '
        f"down below; they are those of the other shards. {warning}"
    ) in page
    assert f'<span class="dq-number" data-dq-stat="pending">{sent}</span>' in page
    assert 'data-dq-shards-down="2"' in page
    assert "Not listed while shards are down" in page
    rows = shard_rows(page)
    assert list(rows) == list(parts(queue.store))
    pending = 0
    for name, row in rows.items():
        if name in shards_down:
            assert f'<tr data-dq-shard="{name}" class="dq-unreachable">' in page
            assert "down (unreachable): Error" in row
            assert "data-dq-shard-stat" not in row
        else:
            pending += int(re.findall(r'data-dq-shard-stat="pending">(\d+)<', row)[0])
    assert pending == sent

    data = client.get(url("queue_json", "default")).json()
    assert (data["ok"], data["shards_down"], data["pending"]) == (False, 2, sent)
    assert f"shard(s) {names} (on 127.0.0.1:{port}): Error " in data["error"]
    assert data["workers"] == 0  # read from shard 0, which answers
    assert {name for name, shard in data["shards"].items() if not shard["ok"]} == set(shards_down)

    overview = client.get(url("changelist")).content.decode()
    assert (
        f'<div class="dq-error dq-partial">The figures leave out 2 shard(s) down. {warning}'
    ) in overview
    assert f'<td data-dq-stat="pending">{sent}</td>' in overview
    every = client.get(url("json")).json()["queues"]["default"]
    assert (every["shards_down"], every["pending"]) == (2, sent)

    # A purge would stop at the first shard down: not offered.
    purge = client_for(users["deleter"]).get(url("purge", "default")).content.decode()
    assert "2 of its shards cannot be reached" in purge
    assert "Yes, purge them" not in purge


def test_delete_acts_only_on_messages_still_in_the_state_the_user_saw(
    users: dict[str, User | None], queue: Queue
) -> None:
    dead = bury(queue)
    waiting = queue.send("soon")
    client = client_for(users["superuser"])
    # The user sees each in its state; meanwhile, another operator requeues the dead
    # letter, and a worker takes both.
    queue.requeue([dead])
    assert {message.id for message in fetch_when_due(queue, count=10)} == {dead, waiting}
    response = client.post(
        url("action", "default"),
        {"action": "delete", "ids": [dead], "state": "garbage"},
        follow=True,
    )
    assert queue.peek(dead) is not None
    assert "Delete: 0 of 1 message(s)" in response.content.decode()
    assert "no longer garbage" in response.content.decode()
    client.post(
        url("action", "default"), {"action": "delete", "ids": [waiting], "state": "pending"}
    )
    assert states_of(queue, waiting) == ["unack"]

    # The forms say which state the user saw.
    for path, state in (
        (url("detail", "default") + "?state=unack", "unack"),
        (url("message", "default", dead), "unack"),
    ):
        assert f'name="state" value="{state}"' in client.get(path).content.decode()

    # A form that does not say which state the user saw deletes nothing.
    page = client.post(url("action", "default"), {"action": "delete", "ids": [dead]}, follow=True)
    assert "Reload the page" in page.content.decode()
    assert queue.peek(dead) is not None


def test_purge_deletes_only_the_dead_letters_the_user_was_asked_about(
    users: dict[str, User | None], queue: Queue
) -> None:
    seen = bury(queue)
    time.sleep(0.005)  # (a burial in the millisecond the page reads is kept)
    client = client_for(users["deleter"])
    page = client.get(url("purge", "default")).content.decode()
    assert "Delete all 1 dead letter(s)" in page
    found = re.search(r'name="buried_before" value="(\d+)"', page)
    assert found is not None
    time.sleep(0.005)  # (the later burials fall in a later millisecond of Redis's clock)
    later = bury(queue)
    response = client.post(url("purge", "default"), {"buried_before": found.group(1)}, follow=True)
    assert "Purged 1 dead letter(s)" in response.content.decode()
    assert queue.peek(seen) is None
    assert states_of(queue, later) == ["garbage"]

    # A form that does not say when the user looked purges nothing.
    for odd in ({}, {"buried_before": "-1"}, {"buried_before": "1" + "0" * 30}):
        response = client.post(url("purge", "default"), odd, follow=True)
        assert "Reload the page" in response.content.decode()
        assert states_of(queue, later) == ["garbage"]


def test_the_change_permission_lets_one_view_as_elsewhere_in_the_admin(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, delay=60)
    client = client_for(make_user("editor", "change_queue"))
    assert url("changelist") in client.get(reverse("admin:index")).content.decode()
    for path in viewing_paths(message_id):
        assert client.get(path).status_code == 200, path
    response = client.post(
        url("action", "default"), {"action": "deliver_now", "ids": [message_id], "state": "pending"}
    )
    assert response.status_code == 302


# Large payloads: the message page shows a bounded part, the whole is a download.

# A message page around its payload, HTML and all (about 10 KB) with room to spare.
PAGE_FRAME = 30_000


@pytest.fixture(params=["redis", "memory"])
def roomy_queue(request: pytest.FixtureRequest, settings: Any) -> Queue:
    """The default queue on Redis or in memory, taking payloads of up to 8 MiB."""
    url = MEMORY_URL if request.param == "memory" else settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = queue_settings(url, MAX_PAYLOAD_BYTES=8 * 1024 * 1024)
    return get_queue()


def shown_payload(page: str) -> str:
    """The text of the page's payload block, unescaped."""
    match = re.search(r'<pre class="dq-payload">(.*?)</pre>', page, re.DOTALL)
    assert match is not None, "no payload block"
    return html.unescape(match.group(1))


def compact(value: Any) -> str:
    """A payload's text as send stores it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_a_large_payload_is_shown_cut_with_a_note_on_a_page_of_bounded_size(
    users: dict[str, User | None], roomy_queue: Queue
) -> None:
    value = {"blob": "x" * (6 * 1024 * 1024), "tail": "<end>"}
    message_id = roomy_queue.send(value)
    response = client_for(users["viewer"]).get(url("message", "default", message_id))
    assert response.status_code == 200
    page = response.content.decode()
    assert len(response.content) < MESSAGE_PAYLOAD_BYTES + PAGE_FRAME
    assert "Showing the first 64 KiB of 6.0 MiB." in page
    assert shown_payload(page) == compact(value)[:MESSAGE_PAYLOAD_BYTES]
    assert url("payload", "default", message_id) in page


def test_the_download_gives_the_whole_payload_as_sent_and_changes_nothing(
    users: dict[str, User | None], roomy_queue: Queue
) -> None:
    value = {"text": "é€😀<&>" * 100_000, "n": [1, 2.5, None, True]}
    message_id = roomy_queue.send(value, delay=60)
    before = roomy_queue.peek(message_id)
    client = client_for(users["viewer"])
    response = client.get(url("payload", "default", message_id))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="default-{message_id}.json"'
    assert response.content == compact(value).encode()
    assert roomy_queue.peek(message_id) == before
    assert client.post(url("payload", "default", message_id)).status_code == 405
    assert client.get(url("payload", "default", "nope")).status_code == 404


def test_the_download_of_an_odd_id_has_a_plain_file_name(users: dict[str, User | None]) -> None:
    message_id = 'a/b c"é\n'
    get_queue().store.send([NewMessage(message_id, "[1]", 3)])
    response = client_for(users["viewer"]).get(url("payload", "default", message_id))
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="default-a_b_c___.json"'
    assert response.content == b"[1]"


@pytest.mark.parametrize("size", [1000, MESSAGE_PAYLOAD_BYTES])
def test_a_payload_up_to_the_limit_is_shown_whole_and_indented_with_a_download(
    users: dict[str, User | None], roomy_queue: Queue, size: int
) -> None:
    padding = size - len(compact({"b": "", "a": 1}))
    value = {"b": "y" * padding, "a": 1}
    assert len(compact(value).encode()) == size
    message_id = roomy_queue.send(value)
    page = client_for(users["viewer"]).get(url("message", "default", message_id)).content.decode()
    assert shown_payload(page) == json.dumps(value, indent=2, sort_keys=True)
    assert "Showing the first" not in page
    assert url("payload", "default", message_id) in page


def test_a_cut_inside_a_character_is_made_before_it(
    users: dict[str, User | None], roomy_queue: Queue
) -> None:
    # '"' then 2-byte characters: byte 65536 is the first half of one.
    message_id = roomy_queue.send("é" * 40_000)
    response = client_for(users["viewer"]).get(url("message", "default", message_id))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Showing the first 64 KiB of 78.1 KiB." in page
    assert shown_payload(page) == '"' + "é" * (MESSAGE_PAYLOAD_BYTES // 2 - 1)


def test_a_payload_not_utf8_is_shown_cut_as_escapes(users: dict[str, User | None]) -> None:
    queue = get_queue()
    store = redis_store(queue)
    # Written past the scripts, as only a foreign client could: a lead byte where the cut
    # falls, and bytes that are no UTF-8 at all.
    payload = b'"' + b"\xff" * (MESSAGE_PAYLOAD_BYTES - 2) + b"\xe2\x82" + b"\xfe" * 1000 + b'"'
    store.client.zadd(store.keys.key("pending"), {"bad": 0})
    store.client.hset(store.keys.key("payload"), "bad", payload)
    response = client_for(users["viewer"]).get(url("message", "default", "bad"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Showing the first 64 KiB of 65.0 KiB." in page
    assert shown_payload(page) == '"' + "\\xff" * (MESSAGE_PAYLOAD_BYTES - 2)


# A payload not UTF-8, as a foreign client writes it: bytes no UTF-8 at all and a "€".
NOT_UTF8 = b'{"text": "caf\xe9 \xff\xfe", "price": "3 \xe2\x82\xac"}'
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "stored",
    [
        NOT_UTF8,  # as a release before the retry budget rode with the payload wrote it
        b"~3~0~" + NOT_UTF8,  # with its retry budget and due time, as send.lua writes it
        b"~3~0~^" + TRACEPARENT + b"^" + NOT_UTF8,  # and a traced send's trace context
    ],
)
def test_the_download_of_a_payload_not_utf8_gives_the_bytes_stored(
    users: dict[str, User | None], stored: bytes
) -> None:
    store = redis_store(get_queue())
    store.client.zadd(store.keys.key("pending"), {"bad": 0})
    store.client.hset(store.keys.key("payload"), "bad", stored)
    client = client_for(users["viewer"])
    response = client.get(url("payload", "default", "bad"))
    assert response.status_code == 200
    assert response.content == NOT_UTF8
    # The page shows it escaped, as before.
    page = client.get(url("message", "default", "bad")).content.decode()
    assert shown_payload(page) == '{"text": "caf\\xe9 \\xff\\xfe", "price": "3 €"}'


def test_a_short_payload_nested_deep_is_shown_as_stored_not_indented_past_a_bound(
    users: dict[str, User | None], roomy_queue: Queue
) -> None:
    # 20 KB of JSON whose indented form is about 2 MB: each level indents every line
    # under it two spaces more.
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    value = [deep] * 100
    assert len(json.dumps(value, indent=2)) > 4 * INDENTED_CHARS
    message_id = roomy_queue.send(value)
    response = client_for(users["viewer"]).get(url("message", "default", message_id))
    assert len(response.content) < INDENTED_CHARS + PAGE_FRAME
    assert shown_payload(response.content.decode()) == compact(value)
