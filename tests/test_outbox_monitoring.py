"""Watching the outbox: outbox_stats, delayqueue_stats, the Prometheus metrics, the admin,
and the system checks of the outbox and exactly-once settings."""

import logging
import math
import re
import threading
import time
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import connections
from django.test import Client

import delayqueue_django as delayqueue
from delayqueue_django import checks
from delayqueue_django.monitoring.reports import queue_report
from delayqueue_django.outbox.models import OutboxMessage
from delayqueue_django.outbox.relay import OutboxRelay
from delayqueue_django.outbox.table import now_ms
from tests.helpers import wait_for
from tests.test_prometheus import TOKEN, of, scrape


def age_rows(alias: str, seconds: float) -> None:
    """As if the rows had been written ``seconds`` ago (no relay ran since)."""
    OutboxMessage.objects.using(alias).update(written_ms=now_ms() - round(seconds * 1000))


def test_outbox_stats_count_the_rows_and_the_oldest_ones_age(database: str) -> None:
    queue = delayqueue.get_queue()
    assert queue.outbox_stats() == {"outbox": 0, "outbox_age_ms": 0}
    queue.send_many(["a", "b"], outbox=True, using=database)
    delayqueue.send("elsewhere", queue="other", outbox=True, using=database)
    age_rows(database, 42)
    stats = queue.outbox_stats()
    assert stats["outbox"] == 2
    assert 42_000 <= stats["outbox_age_ms"] < 60_000
    report = queue_report(queue)
    assert (report["ok"], report["outbox"]) == (True, 2)


def test_stats_carry_the_outbox_of_a_queue_whose_option_is_on(database: str, settings: Any) -> None:
    queues = settings.DELAYQUEUES
    settings.DELAYQUEUES = {**queues, "default": {**queues["default"], "OUTBOX": True}}
    delayqueue.get_queue().send_many(["a", "b"], using=database)
    age_rows(database, 5)
    stats = delayqueue.get_queue().stats()
    assert stats["outbox"] == 2
    assert 5_000 <= stats["outbox_age_ms"] < 60_000
    assert stats["pending"] == 0  # the rows are not in Redis yet
    # Any other queue's stats read Redis alone, with no database query.
    assert "outbox" not in delayqueue.get_queue("other").stats()


@pytest.mark.django_db(transaction=True)
def test_delayqueue_stats_shows_the_outbox_and_counts_its_age_as_lag(settings: Any) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    delayqueue.send("waits", outbox=True)
    age_rows("default", 90)
    out = StringIO()
    call_command("delayqueue_stats", stdout=out)
    assert "default              outbox: 1 waiting, the oldest for 9" in out.getvalue()
    with pytest.raises(CommandError, match="lagging more than 60 s: default") as raised:
        call_command("delayqueue_stats", max_lag=60, stdout=StringIO())
    assert raised.value.returncode == 3
    call_command("delayqueue_stats", max_lag=120, stdout=StringIO())


@pytest.mark.django_db(transaction=True)
def test_the_metrics_show_the_outbox(settings: Any) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = TOKEN
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    delayqueue.get_queue().send_many([1, 2, 3], outbox=True)
    age_rows("default", 5)
    samples = scrape()
    assert of(samples, "delayqueue_outbox_messages") == 3
    assert 5 <= of(samples, "delayqueue_outbox_oldest_seconds") < 30
    assert of(samples, "delayqueue_outbox_messages", queue="other") == 0


@pytest.mark.django_db(transaction=True)
def test_the_admin_overview_shows_the_outbox(settings: Any) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    delayqueue.get_queue().send_many([1, 2], outbox=True)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    aged = time.monotonic()
    age_rows("default", 7)
    page = client.get("/admin/delayqueue_django/queue/").content.decode()
    shown = re.search(r'<td class="dq-outbox">2, oldest (\d+) s</td>', page)
    assert shown is not None, page
    # 7 s old when aged, older by the time the page is made (whole seconds, rounded).
    assert 7 <= int(shown[1]) <= 7 + math.ceil(time.monotonic() - aged)
    assert '<td class="dq-outbox">0</td>' in page  # the queue "other"


def messages_of(found: list[Any]) -> list[tuple[str, str]]:
    return [(message.id, message.msg) for message in found]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"OUTBOX": "yes"}, "delayqueue_django.E030"),
        ({"OUTBOX": True, "SEND_ON_COMMIT": True}, "delayqueue_django.E031"),
        ({"EXACTLY_ONCE": "nowhere"}, "delayqueue_django.E032"),
        ({"EXACTLY_ONCE_RETENTION": -5}, "delayqueue_django.E033"),
    ],
)
def test_option_checks(settings: Any, options: dict[str, Any], expected: str) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://127.0.0.1:6379/0", **options}}
    [found] = checks.check_delayqueues()
    assert found.id == expected


@pytest.mark.django_db(transaction=True)
def test_migrate_does_not_warn_of_the_tables_it_creates(settings: Any) -> None:
    """Django runs the database checks before migrating: before, a new database's first
    migrate printed W030 for the very tables it went on to create (make demo did)."""
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {"default": {"URL": url, "OUTBOX": True, "EXACTLY_ONCE": True}}
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    call_command("migrate", "delayqueue_django", "0001", verbosity=0)
    try:
        said = StringIO()
        call_command(
            "migrate", "delayqueue_django", verbosity=0, skip_checks=False, stderr=said, stdout=said
        )
        assert "W030" not in said.getvalue()
        assert checks.check_outbox_tables(databases=["default"]) == []  # created
        call_command("migrate", "delayqueue_django", "0001", verbosity=0)
        with pytest.raises(SystemCheckError, match="W030"):
            call_command("check", database=["default"], fail_level="WARNING")
    finally:
        call_command("migrate", "delayqueue_django", verbosity=0)


def test_the_outbox_databases_setting_is_checked(settings: Any) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default", "nowhere"]
    [found] = checks.check_outbox_databases()
    assert found.id == "delayqueue_django.E034"
    assert "'nowhere'" in found.msg
    settings.DELAYQUEUE_OUTBOX_DATABASES = "default"
    assert [m.id for m in checks.check_outbox_databases()] == ["delayqueue_django.E034"]


@pytest.mark.django_db(transaction=True)
def test_a_missing_migration_is_a_warning_with_the_command_to_run(settings: Any) -> None:
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {"default": {"URL": url, "OUTBOX": True, "EXACTLY_ONCE": True}}
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    assert checks.check_outbox_tables(databases=["default"]) == []
    call_command("migrate", "delayqueue_django", "0001", verbosity=0)
    try:
        [found] = checks.check_outbox_tables(databases=["default"])
        assert found.id == "delayqueue_django.W030"
        assert "delayqueue_outbox, delayqueue_processed" in found.msg
        assert found.hint == (
            "Apply delayqueue_django's migrations: python manage.py migrate "
            "delayqueue_django --database default"
        )
        # Static checks (no database given) never look.
        assert checks.check_outbox_tables(databases=None) == []
    finally:
        call_command("migrate", "delayqueue_django", verbosity=0)
    assert checks.check_outbox_tables(databases=["default"]) == []


@pytest.mark.django_db
def test_outbox_rows_of_a_queue_no_longer_configured_are_reported(settings: Any) -> None:
    """A queue renamed or removed with rows still in the outbox: no relay reads them (each
    reads its own queues'), and no report counts them; the database check (which migrate
    runs on every deploy) names them."""
    url = settings.DELAYQUEUES["default"]["URL"]
    settings.DELAYQUEUES = {
        "default": {"URL": url, "OUTBOX": True},
        "emails": {"URL": url, "OUTBOX": True},
    }
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    delayqueue.get_queue("emails").send_many(["a", "b"])
    delayqueue.get_queue().send("kept")
    assert checks.check_outbox_tables(databases=["default"]) == []

    settings.DELAYQUEUES = {"default": {"URL": url, "OUTBOX": True}}  # "emails" removed
    [found] = checks.check_outbox_tables(databases=["default"])
    assert found.id == "delayqueue_django.W031"
    assert "database 'default' holds outbox rows of queues not in DELAYQUEUES: 'emails' (2)" in (
        found.msg
    )
    assert "DELETE FROM delayqueue_outbox WHERE queue" in str(found.hint)
    # Static checks (no database given) never look.
    assert checks.check_outbox_tables(databases=None) == []


@pytest.mark.django_db(transaction=True)
def test_a_relay_on_a_database_not_migrated_warns_once_and_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = OutboxRelay([delayqueue.get_queue()], databases=["default"], poll_seconds=0.01)
    call_command("migrate", "delayqueue_django", "0001", verbosity=0)
    thread = threading.Thread(target=relay.run)
    try:
        with caplog.at_level(logging.WARNING, logger="delayqueue_django.relay"):
            thread.start()
            wait_for(lambda: caplog.records, what="the relay's warning")
            time.sleep(0.3)  # 30 polls' worth: it does not look again, nor warn again
        [record] = caplog.records
        assert "database default has no outbox table" in record.getMessage()
        assert "migrate delayqueue_django --database default" in record.getMessage()
    finally:
        relay.stop()
        thread.join(10)
        call_command("migrate", "delayqueue_django", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_a_database_down_leaves_the_queue_report_and_the_stats_command_standing(
    settings: Any,
) -> None:
    """The outbox's database unreachable: the report says so in ``outbox_error`` and keeps
    the queue's figures from Redis (it raised DatabaseError, and delayqueue_stats with it)."""
    settings.DELAYQUEUES = {
        name: {**options, "OUTBOX": True} for name, options in settings.DELAYQUEUES.items()
    }
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    delayqueue.send("in Redis", outbox=False)
    connection = connections["default"]
    name = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = "/nonexistent/folder/db.sqlite3"
    try:
        report = queue_report(delayqueue.get_queue())
        out = StringIO()
        call_command("delayqueue_stats", stdout=out)
    finally:
        connection.close()
        connection.settings_dict["NAME"] = name

    assert (report["ok"], report["pending"], report["outbox"]) == (True, 1, None)
    assert "unable to open database file" in report["outbox_error"]
    assert "default              outbox unreadable: unable to open" in out.getvalue()
