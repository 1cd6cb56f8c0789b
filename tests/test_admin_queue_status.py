"""The admin says how a queue stands (issue #33): paused, a rate limit set at run time over
the RATE_LIMIT setting, and no worker serving it (no live worker process's heartbeat lists
it), in the overview's row of the queue and at the top of the queue's page."""

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from delayqueue_django import get_queue
from delayqueue_django.worker import heartbeat
from tests.conftest import MEMORY_URL

pytestmark = pytest.mark.django_db


def url(name: str, *args: str) -> str:
    return reverse(f"admin:delayqueue_django_queue_{name}", args=args)


def viewer() -> Client:
    user, _ = User.objects.get_or_create(username="viewer", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="delayqueue_django", codename="view_queue")
    )
    client = Client()
    client.force_login(user)
    return client


def text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: its text, unescaped, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def status_cell(page: str, queue_name: str) -> str:
    row = re.search(rf'<tr data-dq-queue="{queue_name}"[^>]*>(.*?)</tr>', page, re.S)
    assert row is not None, queue_name
    cell = re.search(r'<td class="dq-status">(.*?)</td>', row.group(1), re.S)
    assert cell is not None, row.group(1)
    return cell.group(1)


def top_of_queue_page(page: str) -> str:
    """The queue page above its counts: what a reader sees first."""
    return page[page.index('id="content-main"') : page.index('class="dq-counts"')]


@pytest.fixture
def two_queues(settings: Any) -> None:
    """ "default" with RATE_LIMIT 2/s, "other" without; both in memory, so that a heartbeat
    written by the test is the only worker either has."""
    settings.DELAYQUEUES = {
        "default": {"URL": MEMORY_URL, "RATE_LIMIT": "2/s"},
        "other": {"URL": MEMORY_URL},
    }


def beat(queue_name: str, worker_id: str, **details: Any) -> None:
    heartbeat.beat(get_queue(queue_name), worker_id, {"host": "h", **details}, ttl_seconds=30)


@pytest.mark.usefixtures("two_queues")
def test_the_overview_shows_a_paused_queue_its_run_time_rate_and_no_worker() -> None:
    default = get_queue("default")
    default.pause()
    default.set_rate_limit("3/m")
    beat("other", "w1", pid=1)
    beat("other", "w2", pid=2)

    page = viewer().get(url("changelist")).content.decode()
    assert re.search(r"<th [^>]*>State</th>", page)
    cell = status_cell(page, "default")
    assert 'class="dq-error dq-paused"' in cell
    assert 'class="dq-error dq-no-worker"' in cell
    assert text(cell) == "paused rate 3/m, set at run time over RATE_LIMIT 2/s no worker"
    assert text(status_cell(page, "other")) == "flowing 2 workers"


@pytest.mark.usefixtures("two_queues")
def test_a_supervisor_alone_is_no_worker_and_a_run_time_rate_without_a_setting_says_so() -> None:
    other = get_queue("other")
    other.set_rate_limit("5/s")
    beat("other", "sup", role="supervisor", pid=10, processes=2, restarts=0)

    page = viewer().get(url("changelist")).content.decode()
    assert text(status_cell(page, "other")) == (
        "flowing rate 5/s, set at run time (no RATE_LIMIT setting) no worker"
    )
    beat("other", "child", pid=11, supervisor=10)
    page = viewer().get(url("changelist")).content.decode()
    assert text(status_cell(page, "other")).endswith(" 1 worker")


@pytest.mark.usefixtures("two_queues")
def test_the_queue_page_says_paused_run_time_rate_and_no_worker_at_its_top() -> None:
    default = get_queue("default")
    default.pause()
    default.set_rate_limit("3/m")
    top = text(top_of_queue_page(viewer().get(url("detail", "default")).content.decode()))
    assert "Paused: no worker hands out its messages until it is resumed (Flow, below)." in top
    assert "Rate limit 3/m, set at run time, in force over the RATE_LIMIT setting (2/s)." in top
    assert "No worker serves this queue: no live worker's heartbeat lists it." in top

    default.resume()
    default.set_rate_limit(None)
    beat("default", "w1", pid=1)
    top = text(top_of_queue_page(viewer().get(url("detail", "default")).content.decode()))
    assert "Paused" not in top
    assert "set at run time" not in top
    assert "No worker" not in top


@pytest.mark.usefixtures("two_queues")
def test_the_flow_section_names_the_setting_a_run_time_rate_overrides() -> None:
    get_queue("default").set_rate_limit("3/m")
    page = viewer().get(url("detail", "default")).content.decode()
    flow = page[page.index('id="flow"') :]
    flow = text(flow[: flow.index("</div>")])
    assert "Rate limit: 3/m (set at run time, over the RATE_LIMIT setting's 2/s)" in flow
