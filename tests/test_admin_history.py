"""The queue page's "History" section: charts of the metrics history drawn as inline SVG
(no script), each with a title and a description, a table of the same figures, and a
choice of range by query string."""

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import pytest
from django.test import Client

from delayqueue_django import get_queue
from delayqueue_django.admin.charts import history_context
from delayqueue_django.core.queue import Metrics
from tests.helpers import fetch_when_due
from tests.test_admin import client_for, make_user, url

pytestmark = pytest.mark.django_db


def history_section(page: str) -> str:
    return page[page.index('<div class="dq-section" id="history">') :].split(
        '<div class="dq-section"', 2
    )[1]


def viewer() -> Client:
    return client_for(make_user("viewer", "view_queue"))


@pytest.mark.parametrize(
    ("history", "label"),
    [
        ("", "last hour, per minute"),
        ("day", "last day, per 15 minutes"),
        ("14d", "last 14 days, per 3 hours"),
        ("<script>", "last hour, per minute"),  # an unknown range reads as the default
    ],
)
def test_the_queue_page_charts_the_history(history: str, label: str) -> None:
    queue = get_queue()
    queue.send_many(range(3))
    delivered = fetch_when_due(queue, 3)
    queue.ack(delivered[:2])
    queue.bury(delivered[2:])
    response = viewer().get(url("detail", "default"), {"history": history} if history else {})
    assert response.status_code == 200
    section = history_section(response.content.decode())
    assert "<script" not in section
    assert f'<strong aria-current="true">{label}</strong>' in section
    svgs = re.findall(r"<svg class=\"dq-chart\".*?</svg>", section, re.S)
    assert len(svgs) == 2
    for svg in svgs:
        tree = ET.fromstring(svg)  # well-formed SVG
        namespace = "{http://www.w3.org/2000/svg}"
        assert tree.get("role") == "img"
        assert tree.find(f"{namespace}title") is not None
        assert tree.find(f"{namespace}desc") is not None
    assert f"Throughput by outcome, {label}" in svgs[0]
    assert f"Lag of what was handed out, {label}" in svgs[1]
    # The table gives the same figures, the steps with anything in them.
    rows = re.findall(r"<tr><td>[^<]+</td>((?:<td>[^<]*</td>)+)</tr>", section)
    cells = [re.findall(r"<td>([^<]*)</td>", row) for row in rows]
    assert sum(int(c[0]) for c in cells) == 3  # sent
    assert sum(int(c[1]) for c in cells) == 2  # acked
    assert sum(int(c[3]) for c in cells) == 1  # dead
    assert sum(int(c[5]) for c in cells) == 3  # handed out


def test_a_quiet_queue_says_nothing_happened() -> None:
    page = viewer().get(url("detail", "default")).content.decode()
    assert "Nothing was sent or handled in this time." in history_section(page)


def test_the_charts_escape_what_they_draw() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    point = Metrics(start, 1, 2, 3, 4, 5, 6, 1500.0, 2000)
    context = history_context([point, point], "hour")
    for chart in (context["throughput_chart"], context["lag_chart"]):
        ET.fromstring(str(chart))
    assert ">2 s<" in str(context["lag_chart"])  # the largest lag labels the axis
    # A lag missing (nothing handed out) breaks the line instead of drawing 0.
    empty = Metrics(start, 1, 0, 0, 0, 0, 0, None, None)
    lag = str(history_context([point, empty, point], "hour")["lag_chart"])
    assert lag.count("<polyline") == 4  # two lines, each broken in two
    small = Metrics(start, 1, 0, 0, 0, 0, 1, 2.0, 2)
    assert ">0.002 s<" in str(history_context([small], "hour")["lag_chart"])
