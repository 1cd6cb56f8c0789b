"""Bad input fuzzing of the admin: arbitrary query strings (invalid UTF-8 included), message
ids in the path and action forms get a page, a redirect or a 404, never a server error, and
the queue's invariants hold afterwards."""

from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Query strings are bytes on the wire: any bytes, percent-encoded, invalid UTF-8 included.
raw = st.binary(max_size=20).map(lambda b: quote_from_bytes(b, safe=""))
words = st.sampled_from(
    ["pending", "ready", "unack", "retry", "garbage", "1", "-1", "0", "", "requeue", "delete"]
)
values = words | raw | st.integers(-(10**30), 10**30).map(str) | st.just("9" * 5000)
keys = (
    st.sampled_from(["state", "page", "q", "o", "p", "_changelist_filters", "error", "action"])
    | raw
)
queries = st.lists(st.tuples(keys, values), max_size=4).map(
    lambda pairs: "&".join(f"{key}={value}" for key, value in pairs)
)
names = st.sampled_from(["default", "other", "nope"]) | raw


@pytest.fixture
def client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


@pytest.fixture
def busy() -> tuple[Queue, list[str]]:
    """A queue with messages waiting, in flight and dead; and their ids."""
    queue = get_queue()
    ids = queue.send_many([{"n": n} for n in range(4)], delay=3600)
    ids += queue.send_many(["x", "y"], retry_count=0)
    dead, flying = queue.fetch(2).messages
    queue.nack([dead])
    ids.append(flying.id)
    return queue, ids


def assert_consistent(queue: Queue) -> None:
    report = queue.check_invariants()
    assert report.ok, report.problems


@FUZZ
@given(name=names, query=queries)
def test_pages_never_fail(
    client: Client, busy: tuple[Queue, list[str]], name: str, query: str
) -> None:
    queue, _ = busy
    base = reverse("admin:delayqueue_django_queue_changelist")
    for path in (
        "",
        f"{name}/",
        f"{name}/stats.json",
        "stats.json",
        f"{name}/purge/",
        f"{name}/dead-letters/by-error/",
    ):
        response = client.get(f"{base}{path}?{query}")
        # (The bulk action's page, given no action or class, goes back to the dead letters.)
        allowed = (200, 302, 404) if path.endswith("by-error/") else (200, 404)
        assert response.status_code in allowed, (path, query, response.status_code)
    assert_consistent(queue)


@FUZZ
@given(message_id=st.text(max_size=40) | st.just("x" * 5000), name=names)
def test_message_pages_never_fail(
    client: Client, busy: tuple[Queue, list[str]], message_id: str, name: str
) -> None:
    queue, ids = busy
    base = reverse("admin:delayqueue_django_queue_changelist")
    for candidate in (message_id, *ids[-2:]):
        encoded = quote(candidate.encode("utf-8", "surrogatepass"), safe="")
        response = client.get(f"{base}{name}/messages/{encoded}/")
        assert response.status_code in (200, 404), (name, candidate, response.status_code)
    assert_consistent(queue)


@FUZZ
@given(
    action=st.sampled_from(["requeue", "deliver_now", "reschedule", "delete", ""])
    | st.text(max_size=10),
    state=words | st.text(max_size=10),
    picks=st.lists(st.integers(0, 6), max_size=3),
    odd_ids=st.lists(st.text(max_size=20), max_size=3),
    next_url=st.sampled_from(["", "/admin/", "https://evil.example/", "//evil.example"])
    | st.text(max_size=20),
    # The reschedule form's fields: the form posted back, or not.
    due=st.dictionaries(
        st.sampled_from(["delay", "at", "confirmed"]),
        st.sampled_from(["", "0", "1", "-1", "nan", "1e400", "2099-01-01T00:00", "2001-01-01"])
        | st.text(max_size=12),
    ),
)
def test_actions_never_fail_nor_corrupt_the_queue(
    client: Client,
    busy: tuple[Queue, list[str]],
    action: str,
    state: str,
    picks: list[int],
    odd_ids: list[str],
    next_url: str,
    due: dict[str, str],
) -> None:
    queue, ids = busy
    url = reverse("admin:delayqueue_django_queue_action", args=["default"])
    chosen = [ids[i] for i in picks] + odd_ids
    data: dict[str, Any] = {
        "action": action,
        "state": state,
        "ids": chosen,
        "next": next_url,
        **due,
    }
    response = client.post(url, _text_only(data))
    # A redirect back, or the reschedule form's page (asking, or saying what is wrong).
    assert response.status_code in (200, 302)
    if response.status_code == 200:
        assert action == "reschedule"
        assert b"Reschedule" in response.content
        assert b"evil.example" not in response.content  # its way back is on this site
    else:
        assert not response["Location"].startswith(("https://evil", "//evil"))
    assert_consistent(queue)


@FUZZ
@given(
    action=st.sampled_from(["requeue", "delete", ""]) | st.text(max_size=10),
    error=st.sampled_from(["-", "(nack)", "builtins.ValueError", ""]) | st.text(max_size=20),
    buried_before=st.sampled_from(["", "0", "-1", "9" * 40, "nan"])
    | st.integers(0, 2**64).map(str)
    | st.text(max_size=12),
)
def test_the_bulk_actions_by_error_never_fail_nor_corrupt_the_queue(
    client: Client, busy: tuple[Queue, list[str]], action: str, error: str, buried_before: str
) -> None:
    queue, _ = busy
    url = reverse("admin:delayqueue_django_queue_by_error", args=["default"])
    data = {"action": action, "error": error, "buried_before": buried_before}
    response = client.post(url, _text_only(data))
    assert response.status_code == 302
    assert_consistent(queue)


def _text_only(data: dict[str, Any]) -> dict[str, Any]:
    """Form fields as a browser would send them: text that UTF-8 can carry."""

    def clean(value: str) -> str:
        return value.encode("utf-8", "replace").decode("utf-8")

    return {
        key: [clean(item) for item in value] if isinstance(value, list) else clean(value)
        for key, value in data.items()
    }
