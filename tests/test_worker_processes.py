"""``manage.py run_delayqueue`` as real processes: signals, kill -9, restarts, many workers."""

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from delayqueue_django import get_queue
from delayqueue_django.queue import Queue
from tests.helpers import wait_for
from tests.redis_servers import RedisServer
from tests.worker_handlers import read_log

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(90)


class WorkerProcess:
    def __init__(self, redis_url: str, *args: str, **env: str) -> None:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            "DQ_TEST_REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "run_delayqueue", "-v", "2", *args],
            env=environment,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream: IO[str] = self.process.stdout  # type: ignore[assignment]
        for line in stream:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"worker did not exit within {timeout}s:\n{self.output}") from None
        self._reader.join(timeout=5)
        return code

    def wait_for_line(self, text: str, timeout: float = 20) -> None:
        wait_for(lambda: text in self.output, timeout=timeout, what=f"{text!r} in the output")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def workers(redis_server: RedisServer) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


def spawn(workers: list[WorkerProcess], redis_url: str, *args: str, **env: str) -> WorkerProcess:
    worker = WorkerProcess(redis_url, *args, **env)
    workers.append(worker)
    return worker


def queue_for(settings: Any, url: str, **options: Any) -> Queue:
    settings.DELAYQUEUES = {
        "default": {"URL": url, "NACK_REDELIVERY_DELAY": 0, **options},
    }
    return get_queue()


def events(kind: str) -> list[dict[str, Any]]:
    return [entry for entry in read_log() if entry["event"] == kind]


def test_an_idle_worker_exits_at_once_on_sigterm(
    workers: list[WorkerProcess], redis_server: RedisServer
) -> None:
    worker = spawn(workers, redis_server.url)
    worker.wait_for_line("queue 'default'")
    time.sleep(0.3)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert "SIGTERM received" in worker.output


def test_sigterm_lets_the_running_handler_finish_and_hands_back_the_rest(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    running = queue.send({"do": "sleep", "seconds": 1.5})
    buffered = queue.send({"n": "waits"}, delay=0.01)
    time.sleep(0.05)
    worker = spawn(workers, redis_server.url, "--batch-size", "2")
    wait_for(lambda: events("start"), timeout=20, what="the handler to start")
    worker.signal(signal.SIGTERM)

    assert worker.wait(timeout=20) == 0, worker.output
    assert [e["id"] for e in events("done")] == [running]
    assert [e["id"] for e in events("acked")] == [running]
    assert queue.peek(running) is None
    back = queue.peek(buffered)
    assert back is not None
    assert back.state == "ready"
    assert back.attempt == 0  # handed back without using a retry
    assert "stopped: 1 handled, 0 failed." in worker.output


def test_a_second_signal_exits_at_once(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    message_id = queue.send({"do": "sleep", "seconds": 30})
    worker = spawn(workers, redis_server.url)
    wait_for(lambda: events("start"), timeout=20, what="the handler to start")
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) != 0
    assert time.monotonic() - started < 5
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "unack"  # comes back through its deadline


def test_kill_9_mid_handler_loses_nothing(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=1)
    message_id = queue.send({"do": "sleep-first", "seconds": 30})
    first = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1")
    wait_for(lambda: events("start"), timeout=20, what="the handler to start")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)

    second = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1")
    [done] = wait_for(lambda: events("done"), timeout=30, what="the redelivery")
    assert (done["id"], done["attempt"], done["pid"]) == (message_id, 2, second.pid)
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=20) == 0


def test_the_exhaustion_signal_survives_a_worker_dying_while_announcing_it(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=1, RETRY_COUNT=0)
    message_id = queue.send({"do": "false"}, retry_count=0)
    dying = spawn(
        workers,
        redis_server.url,
        DQ_TEST_MAX_CONSUME="1",
        DQ_TEST_RETRY_COUNT="0",
        DQ_TEST_DIE_ON_EXHAUSTED="1",
    )
    assert dying.wait(timeout=20) == 9  # died inside the receiver, before confirming
    [first] = events("exhausted")
    assert first["pid"] == dying.pid
    assert queue.stats()["unannounced"] == 1

    survivor = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", DQ_TEST_RETRY_COUNT="0")
    wait_for(lambda: len(events("exhausted")) == 2, timeout=30, what="the second announcement")
    second = events("exhausted")[1]
    assert (second["id"], second["pid"], second["payload"]) == (
        message_id,
        survivor.pid,
        {"do": "false"},
    )
    wait_for(lambda: queue.stats()["unannounced"] == 0, what="the confirmation")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0


def test_the_worker_carries_on_through_a_redis_restart(
    workers: list[WorkerProcess], settings: Any
) -> None:
    server = RedisServer()
    try:
        queue = queue_for(settings, server.url)
        worker = spawn(workers, server.url)
        worker.wait_for_line("queue 'default'")
        time.sleep(0.3)
        server.restart()
        time.sleep(1.5)  # the worker notices, logs and backs off
        message_id = queue.send({"n": "after the restart"})
        wait_for(lambda: events("done"), timeout=30, what="delivery after the restart")
        assert [e["id"] for e in events("done")] == [message_id]
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
        assert "redis unavailable" in worker.output or "subscription lost" in worker.output
    finally:
        server.close()


def test_several_worker_processes_share_a_queue_without_duplicates(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    ids = queue.send_many([{"n": n} for n in range(300)], delay=0.5)
    ids += queue.send_many([{"n": n} for n in range(300, 600)])
    for _ in range(3):
        spawn(workers, redis_server.url, "--concurrency", "2")
    wait_for(lambda: len(events("done")) >= 600, timeout=60, what="all 600 handled")
    handled = Counter(e["id"] for e in events("done"))
    assert set(handled) == set(ids)
    assert max(handled.values()) == 1  # no timeouts, so no duplicates
    assert len({e["pid"] for e in events("done")}) >= 2
    for worker in workers:
        # A slow start can leave a worker idle before it has set up its signal handlers.
        worker.wait_for_line("queue 'default'")
        worker.signal(signal.SIGTERM)
    assert [worker.wait(timeout=20) for worker in workers] == [0, 0, 0]


def test_a_handler_outliving_the_grace_period_is_left_to_its_deadline(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    message_id = queue.send({"do": "sleep", "seconds": 30})
    worker = spawn(workers, redis_server.url, "--grace", "0.5")
    wait_for(lambda: events("start"), timeout=20, what="the handler to start")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert time.monotonic() - started < 10
    assert "grace period" in worker.output
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "unack"
