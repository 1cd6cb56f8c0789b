"""A real browser (headless Chromium) logs in, reads the counts and requeues a dead letter.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); without
them this test is skipped with the reason. Set DQ_SCREENSHOT_DIR to keep the screenshot.
"""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from delayqueue_django import get_queue
from tests.helpers import fetch_when_due, states_of, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Chromium and its driver (Debian: apt-get install chromium chromium-driver)",
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def test_a_staff_user_logs_in_sees_the_counts_and_requeues_a_dead_letter(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    User.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    queue = get_queue()
    queue.send_many([{"order": n} for n in range(3)], delay=3600)
    dead = queue.send({"order": 99, "note": "payment provider down"}, retry_count=0)
    [message] = [m for m in fetch_when_due(queue) if m.id == dead]
    queue.nack([message])

    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("secret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "Delay queues" in browser.page_source, what="the admin index")

    browser.find_element(By.LINK_TEXT, "Queues").click()
    browser.find_element(By.LINK_TEXT, "default").click()
    counts = {
        cell.get_attribute("data-dq-stat"): cell.text
        for cell in browser.find_elements(By.CSS_SELECTOR, ".dq-counts [data-dq-stat]")
    }
    assert counts["pending"] == "3"
    assert counts["garbage"] == "1"

    queue.send({"order": "new"}, delay=3600)  # the page refreshes its counts on its own
    pending = browser.find_element(By.CSS_SELECTOR, ".dq-counts [data-dq-stat=pending]")
    wait_for(lambda: pending.text == "4", timeout=15, what="the counts to refresh")

    browser.find_element(By.CSS_SELECTOR, ".dq-counts a[href='?state=garbage']").click()
    assert "payment provider down" in browser.page_source
    screenshot_dir = Path(os.environ.get("DQ_SCREENSHOT_DIR", tmp_path))
    browser.save_screenshot(str(screenshot_dir / "admin-queue.png"))

    browser.find_element(By.CSS_SELECTOR, f"input[name=ids][value='{dead}']").click()
    Select(browser.find_element(By.CSS_SELECTOR, "select[name=action]")).select_by_value("requeue")
    browser.find_element(By.CSS_SELECTOR, ".actions button[type=submit]").click()
    wait_for(lambda: "1 of 1 message(s)" in browser.page_source, what="the success message")
    assert states_of(queue, dead) == ["pending"]


def test_a_staff_user_pauses_and_resumes_a_queue(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    queue = get_queue()
    queue.send_many([{"order": n} for n in range(3)], delay=3600)
    queue.send_many([{"order": n} for n in range(2)])  # due: they wait while paused

    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("secret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "Delay queues" in browser.page_source, what="the admin index")
    browser.find_element(By.LINK_TEXT, "Queues").click()
    browser.find_element(By.LINK_TEXT, "default").click()

    browser.find_element(By.CSS_SELECTOR, "#flow button[value=pause]").click()
    wait_for(lambda: "Paused: no worker" in browser.page_source, what="the paused queue")
    assert queue.stats()["paused"] == 1
    assert queue.fetch(10).messages == []  # nothing handed out while paused
    screenshot_dir = Path(os.environ.get("DQ_SCREENSHOT_DIR", tmp_path))
    browser.save_screenshot(str(screenshot_dir / "admin-queue-paused.png"))

    browser.find_element(By.CSS_SELECTOR, "#flow button[value=resume]").click()
    wait_for(lambda: "Flowing." in browser.page_source, what="the resumed queue")
    assert queue.stats()["paused"] == 0
    assert len(fetch_when_due(queue, 10)) == 2


def test_a_staff_user_reads_the_history_charts_and_picks_a_range(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    queue = get_queue()
    queue.send_many([{"order": n} for n in range(6)])
    delivered = fetch_when_due(queue, 6)
    queue.ack(delivered[:4])
    queue.nack(delivered[4:5], delay=3600)
    queue.bury(delivered[5:])

    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("secret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "Delay queues" in browser.page_source, what="the admin index")
    browser.find_element(By.LINK_TEXT, "Queues").click()
    browser.find_element(By.LINK_TEXT, "default").click()

    charts = browser.find_elements(By.CSS_SELECTOR, "#history svg.dq-chart[role=img]")
    assert len(charts) == 2
    assert all(chart.size["width"] > 300 and chart.size["height"] > 60 for chart in charts)
    assert browser.find_elements(By.CSS_SELECTOR, "#history polyline")  # lines drawn
    current = browser.find_element(By.CSS_SELECTOR, "#history [aria-current=true]")
    assert current.text == "last hour, per minute"
    browser.find_element(By.CSS_SELECTOR, "#history summary").click()
    sent = browser.find_elements(By.CSS_SELECTOR, ".dq-history-table tbody td:nth-child(2)")
    assert sum(int(cell.text) for cell in sent) == 6
    history = browser.find_element(By.ID, "history")
    browser.execute_script("arguments[0].scrollIntoView();", history)
    screenshot_dir = Path(os.environ.get("DQ_SCREENSHOT_DIR", tmp_path))
    history.screenshot(str(screenshot_dir / "admin-queue-history.png"))

    browser.find_element(By.LINK_TEXT, "last 14 days, per 3 hours").click()
    wait_for(lambda: "history=14d" in browser.current_url, what="the 14 days' range")
    current = browser.find_element(By.CSS_SELECTOR, "#history [aria-current=true]")
    assert current.text == "last 14 days, per 3 hours"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#history svg.dq-chart")) == 2
