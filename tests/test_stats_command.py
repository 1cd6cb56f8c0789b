"""``manage.py delayqueue_stats``: tables, JSON, and exit codes for health probes."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.placement import slot_of
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.management.commands.delayqueue_stats import COUNTS
from delayqueue_django.worker import Worker, heartbeat
from tests.backends import SHARDED_BACKENDS
from tests.helpers import send_what_reaches_redis, wait_for
from tests.redis_servers import RedisServer
from tests.worker_handlers import UNBLOCK, handle

ROOT = Path(__file__).resolve().parent.parent


def stats(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("delayqueue_stats", *args, stdout=out, **options)
    return out.getvalue()


def test_the_table_shows_counts_lag_and_workers(queue: Queue) -> None:
    queue.send("later", delay=3600)
    queue.send("due now")
    heartbeat.beat(
        queue, "w1", {"host": "box", "pid": 7, "handled": 3, "failed": 1}, ttl_seconds=30
    )
    text = stats("default")
    header, row, *shard_rows = text.splitlines()
    # (A sharded queue's shards, a row each, follow: see below.)
    shards = parts(queue.store)
    assert len(shard_rows) == (0 if len(shards) == 1 else len(shards))
    assert header.split()[:8] == [
        "queue",
        "pending",
        "ready",
        "unack",
        "retry",
        "garbage",
        "due",
        "lag",
    ]
    assert row.split()[:7] == ["default", "2", "0", "0", "0", "0", "1"]
    assert "box:7 (3 handled, 1 failed)" in row
    assert "other" not in text


def test_json_for_scripts() -> None:
    get_queue().send("x", delay=60)
    data = json.loads(stats(json=True))
    assert set(data["queues"]) == {"default", "other"}
    assert data["queues"]["default"]["pending"] == 1
    assert data["queues"]["default"]["workers"] == []
    assert data["queues"]["default"]["ok"] is True


def test_running_handlers_are_shown_with_their_age_in_the_table_and_the_json(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "MAX_CONSUME_DURATION": 0.5}}
    queue = get_queue()
    message_id = queue.send({"do": "block"})
    UNBLOCK.clear()
    worker = Worker([(queue, handle)], heartbeat_interval=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:

        def running() -> list[dict[str, Any]]:
            workers = json.loads(stats(json=True))["queues"]["default"]["workers"]
            return [h for w in workers for h in w.get("running", []) if h["past_deadline"]]

        [handler] = wait_for(running, what="the handler past its deadline in the JSON")
        assert handler["id"] == message_id
        assert handler["age"] >= 0.4
        [_, row, running_line] = stats("default").splitlines()
        assert f":{os.getpid()} (0 handled, 0 failed)" in row
        assert re.fullmatch(
            rf"  \S+:{os.getpid()} running {message_id} \(default, attempt 1\) "
            r"for \d+\.\d s, past its deadline",
            running_line,
        ), running_line
    finally:
        UNBLOCK.set()
        worker.request_stop()
        thread.join(timeout=10)


def test_a_lagging_queue_exits_3() -> None:
    get_queue().send("overdue")
    time.sleep(0.05)
    stats("--max-lag", "10")  # within bounds: no error
    with pytest.raises(CommandError, match=r"lagging more than 0\.01 s: default") as caught:
        stats("--max-lag", "0.01")
    assert caught.value.returncode == 3


def test_messages_waiting_in_the_staging_lists_count_as_lag() -> None:
    # Issue #33: a slow worker's fetch stages every due message (up to STAGE_BATCH_SIZE)
    # and takes a few; the rest wait in ready, where lag did not look: "lag 0.0 s", and
    # --max-lag passed however long they waited.
    queue = get_queue()
    queue.send_many([{"n": n} for n in range(10)])
    assert len(queue.fetch(3).messages) == 3
    time.sleep(0.3)
    assert (queue.stats()["pending"], queue.stats()["ready"]) == (0, 7)
    [_, row] = stats("default").splitlines()
    assert re.search(r" 0\.[3-9] s ", row), row
    with pytest.raises(CommandError, match=r"lagging more than 0\.2 s: default") as caught:
        stats("--max-lag", "0.2")
    assert caught.value.returncode == 3


def test_a_queue_without_workers_exits_4_when_workers_are_required() -> None:
    with pytest.raises(CommandError, match="no live worker for default, other") as caught:
        stats("--require-workers")
    assert caught.value.returncode == 4
    for name in ("default", "other"):
        heartbeat.beat(get_queue(name), "w", {"host": "h", "pid": 1}, ttl_seconds=30)
    stats("--require-workers")


def test_unreachable_redis_exits_1(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://127.0.0.1:1/0"}}
    with pytest.raises(CommandError, match="Redis unavailable for default") as caught:
        stats()
    assert caught.value.returncode == 1


def test_bad_arguments_and_unknown_queues_are_command_errors() -> None:
    with pytest.raises(CommandError, match="no queue named 'nope'"):
        stats("nope")
    with pytest.raises(CommandError, match=r"must be a finite number of seconds > 0, not 0$"):
        stats("--watch", "0")
    # Not ">= 0", which would have a 0 pass.
    with pytest.raises(CommandError, match=r"must be a finite number of seconds > 0, not -1$"):
        stats("--watch", "-1")


def test_no_queue_configured_is_a_command_error_not_a_healthy_probe(settings: Any) -> None:
    # A probe that looks at nothing must not pass: DELAYQUEUES lost in a deploy would
    # otherwise read as healthy, --require-workers and all.
    settings.DELAYQUEUES = {}
    for args in ((), ("--json",), ("--require-workers", "--max-lag", "60")):
        with pytest.raises(CommandError, match="DELAYQUEUES defines no queue") as caught:
            stats(*args)
        assert caught.value.returncode == 1


@pytest.mark.parametrize("verdict", [("--max-lag", "60"), ("--require-workers",)])
def test_watch_with_an_exit_status_option_is_refused(verdict: tuple[str, ...]) -> None:
    # --watch ends only when interrupted, and then with 0: a --max-lag or --require-workers
    # beside it would never be applied.
    with pytest.raises(CommandError, match="--watch cannot be combined with") as caught:
        stats("--watch", "1", *verdict)
    assert caught.value.returncode == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_watch_prints_again_until_a_signal_stops_it_with_0(
    redis_server: RedisServer, signum: signal.Signals
) -> None:
    """Ctrl-C at a terminal, SIGTERM from a supervisor or ``kill``: both a clean stop (before,
    SIGTERM killed it: status 143 in a shell)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
        "DQ_TEST_REDIS_URL": redis_server.url,
        "PYTHONPATH": str(ROOT),
        # On a SIGABRT (sent below if it does not stop), every thread's stack to stderr.
        "PYTHONFAULTHANDLER": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "delayqueue_stats", "--watch", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        headers = 0
        deadline = time.monotonic() + 30
        while headers < 2:  # two reports printed
            assert time.monotonic() < deadline, "no second report"
            headers += process.stdout.readline().startswith("queue")
        process.send_signal(signum)
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stacks = process.communicate(timeout=10)
            raise AssertionError(f"still running 10 s after {signum.name}:\n{stacks}") from None
        assert code == 0, process.communicate()[1]
    finally:
        if process.poll() is None:
            process.kill()


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
def test_a_process_of_its_own_refuses_a_memory_queue(
    settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayqueue_django.management.commands.delayqueue_stats import Command

    settings.DELAYQUEUES = {"default": {"URL": "memory://"}}
    stats()  # in this process (call_command), a memory queue is there to be seen
    with pytest.raises(SystemExit) as exited:  # as manage.py delayqueue_stats would
        Command().run_from_argv(["manage.py", "delayqueue_stats"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "CommandError: queue 'default' keeps its messages in the memory of the process that "
        "sends them (memory://); a process of its own would never see them. Look at them from "
        "that process (the admin, or call_command('delayqueue_stats')), or give the queue a "
        "Redis URL.\n"
    )


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_a_sharded_queue_has_a_row_per_shard_under_its_unchanged_totals(
    configure: Callable[..., Queue], backend_url: str
) -> None:
    queue = configure()
    for n in range(20):
        queue.send({"n": n}, delay=3600)
    sent = time.monotonic()
    queue.send("due now")
    stores = parts(queue.store)
    totals = queue.stats()

    lines = stats("default").splitlines()
    assert lines[1].split()[:7] == ["default", "21", "0", "0", "0", "0", "1"]
    # The lag of the message due now: the time since its send, shown to a tenth of a second
    # (a loaded machine takes more than 50 ms to get here: it reads 0.1 or more).
    assert 0 <= float(lines[1].split()[7]) <= time.monotonic() - sent + 0.05
    assert len(lines) == 2 + len(stores)
    on_cluster = "cluster" in backend_url
    for line, (name, store) in zip(lines[2:], stores.items(), strict=True):
        figures = store.stats()
        words = line.split()
        assert words[:2] == ["shard", name]
        assert words[2:8] == [str(figures[count]) for count in COUNTS]
        where = re.escape(f" {store.keys.tag}")
        if on_cluster:
            where += rf" slot {slot_of(store.keys)} on 127\.0\.0\.1:\d+"
        assert re.search(where + "$", line), line
    assert sum(int(line.split()[2]) for line in lines[2:]) == totals["pending"] == 21

    data = json.loads(stats("default", json=True))["queues"]["default"]
    assert {key: data[key] for key in COUNTS} == {key: totals[key] for key in COUNTS}
    assert list(data["shards"]) == list(stores)
    assert sum(shard["pending"] for shard in data["shards"].values()) == 21

    assert len(stats("default", "--no-shards").splitlines()) == 2
    assert (
        "shards" not in json.loads(stats("default", "--no-shards", json=True))["queues"]["default"]
    )


def test_an_unsharded_queue_has_no_shard_rows() -> None:
    assert len(stats("default").splitlines()) == 2
    assert "shards" not in json.loads(stats("default", json=True))["queues"]["default"]


@pytest.mark.cluster
def test_a_shard_that_cannot_be_reached_exits_1_after_the_others_figures_and_a_warning(
    shards_down: list[str],
) -> None:
    sent = send_what_reaches_redis(get_queue(), 12)
    out = StringIO()
    with pytest.raises(CommandError, match="Redis unavailable for default") as caught:
        call_command("delayqueue_stats", stdout=out)
    assert caught.value.returncode == 1
    names = ", ".join(shards_down)
    _, queue_row, warning, *shard_rows = out.getvalue().splitlines()
    assert queue_row.split()[:3] == ["default", str(sent), "0"]
    assert queue_row.endswith(" none")  # shard 0, holding the heartbeats, answers
    assert re.match(
        rf"default +warning: the figures above leave out 2 shard\(s\) down: queue 'default' "
        rf"cannot reach Redis for shard\(s\) {names} \(on 127\.0\.0\.1:\d+\): Error ",
        warning,
    ), warning
    assert len(shard_rows) == 6
    pending = 0
    for row in shard_rows:
        name = row.split()[1]
        if name in shards_down:
            assert row.split()[2:4] == ["unreachable:", "Error"]
        else:
            pending += int(row.split()[2])
    assert pending == sent

    out = StringIO()
    with pytest.raises(CommandError):
        call_command("delayqueue_stats", stdout=out, json=True)
    data = json.loads(out.getvalue())["queues"]["default"]
    assert (data["ok"], data["shards_down"], data["pending"]) == (False, 2, sent)
