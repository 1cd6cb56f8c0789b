"""``manage.py delayqueue_stats``: tables, JSON, and exit codes for health probes."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue
from delayqueue_django.queue import Queue
from delayqueue_django.worker import Worker, heartbeat
from tests.helpers import wait_for
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
    header, row = text.splitlines()
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
    with pytest.raises(CommandError, match="must be more than 0 seconds"):
        stats("--watch", "0")


def test_watch_prints_again_until_interrupted(redis_server: RedisServer) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
        "DQ_TEST_REDIS_URL": redis_server.url,
        "PYTHONPATH": str(ROOT),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "delayqueue_stats", "--watch", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        headers = 0
        deadline = time.monotonic() + 30
        while headers < 2:  # two reports printed
            assert time.monotonic() < deadline, "no second report"
            headers += process.stdout.readline().startswith("queue")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()


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
