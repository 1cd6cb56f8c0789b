"""A real browser (headless Chromium) logs in, reads the counts and requeues a dead letter,
pauses and resumes a queue, reads a dead letter's attempts, requeues the dead letters of one
error class, and reads the history charts.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); without
them these tests are skipped with the reason, but for under CI (``CI`` set), where they
fail: there a missing browser is a broken set-up, not a choice. Set DQ_SCREENSHOT_DIR to
keep the screenshots.
"""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from delayqueue_django import get_queue
from tests.attempt_records import PAYMENT_DOWN, PaymentDown, bury_with, raised
from tests.helpers import fetch_when_due, states_of, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(
        (CHROMIUM is None or CHROMEDRIVER is None) and not os.environ.get("CI"),
        reason="needs Chromium and its driver (Debian: apt-get install chromium chromium-driver)",
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM, "CI needs Chromium (see .ci/run)"
    assert CHROMEDRIVER, "CI needs Chromium's driver (see .ci/run)"
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


def log_in(browser: Any, live_server: Any) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("secret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "Delay queues" in browser.page_source, what="the admin index")


def test_a_staff_user_reads_why_a_dead_letter_died_in_its_attempts(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    queue = get_queue()
    message_id = queue.send({"order": 42, "amount": "19.90"}, retry_count=2)
    for error in (
        PaymentDown("payment provider answered 503 Service Unavailable"),
        TimeoutError("read timed out after 10 s"),
        PaymentDown("payment provider answered 503 Service Unavailable"),
    ):
        [message] = [m for m in fetch_when_due(queue) if m.id == message_id]
        note = queue.attempt_note(message, raised(error), ran_seconds=1.5)
        queue.nack([message], delay=0, attempts={message_id: note})
    assert states_of(queue, message_id) == ["garbage"]

    log_in(browser, live_server)
    browser.get(f"{live_server.url}/admin/delayqueue_django/queue/default/?state=garbage")
    browser.find_element(By.LINK_TEXT, message_id).click()
    rows = browser.find_elements(By.CSS_SELECTOR, "table.dq-attempts tbody tr")
    assert [row.get_attribute("data-dq-attempt") for row in rows] == ["3", "2", "1"]
    assert "builtins.TimeoutError: read timed out after 10 s" in rows[1].text
    assert f"{PAYMENT_DOWN}: payment provider answered 503" in rows[0].text
    assert "1.500 s" in rows[0].text

    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "attempts"))
    screenshot_dir = Path(os.environ.get("DQ_SCREENSHOT_DIR", tmp_path))
    browser.save_screenshot(str(screenshot_dir / "admin-attempts.png"))

    # The traceback is folded: shown once its summary is clicked.
    traceback = rows[0].find_element(By.CSS_SELECTOR, "details.dq-traceback pre")
    assert not traceback.is_displayed()
    rows[0].find_element(By.CSS_SELECTOR, "details.dq-traceback summary").click()
    wait_for(traceback.is_displayed, what="the traceback unfolded")
    assert "raise error" in traceback.text


def test_a_staff_user_filters_the_dead_letters_by_error_and_requeues_one_class(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    queue = get_queue()
    down = [
        bury_with(queue, PaymentDown("payment provider answered 503"), {"order": n})
        for n in range(3)
    ]
    others = [
        bury_with(queue, ValueError(f"invalid amount: '{n},90'"), {"order": 10 + n})
        for n in range(2)
    ]

    log_in(browser, live_server)
    browser.get(f"{live_server.url}/admin/delayqueue_django/queue/default/?state=garbage")
    choices = {
        link.get_attribute("data-dq-error"): link
        for link in browser.find_elements(By.CSS_SELECTOR, ".dq-error-choices a[data-dq-error]")
    }
    assert set(choices) == {PAYMENT_DOWN, "builtins.ValueError"}
    choices[PAYMENT_DOWN].click()
    wait_for(lambda: "3 dead letter(s) whose last error is" in browser.page_source, what="3")
    listed = browser.find_elements(By.CSS_SELECTOR, "#result_list input[name=ids]")
    assert {box.get_attribute("value") for box in listed} == set(down)
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "errors"))
    screenshot_dir = Path(os.environ.get("DQ_SCREENSHOT_DIR", tmp_path))
    browser.save_screenshot(str(screenshot_dir / "admin-dead-letters-by-error.png"))

    browser.find_element(By.PARTIAL_LINK_TEXT, "Requeue all with this error").click()
    count = browser.find_element(By.CSS_SELECTOR, ".dq-by-error-count")
    assert "all 3 dead letter(s)" in count.text
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in down)
    browser.find_element(By.CSS_SELECTOR, "form.dq-by-error input[type=submit]").click()
    wait_for(
        lambda: "3 dead letter(s) of queue 'default'" in browser.page_source,
        what="the success message",
    )
    assert all(states_of(queue, message_id) == ["pending"] for message_id in down)
    assert all(states_of(queue, message_id) == ["garbage"] for message_id in others)


def test_a_staff_user_reads_the_history_charts_and_picks_a_range(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    queue = get_queue()
    queue.send_many([{"order": n} for n in range(6)])
    delivered = fetch_when_due(queue, 6)
    queue.ack(delivered[:4])
    queue.nack(delivered[4:5], delay=3600)
    queue.bury(delivered[5:])

    log_in(browser, live_server)
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
