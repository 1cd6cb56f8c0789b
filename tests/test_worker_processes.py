"""``manage.py run_delayqueue`` as real processes: signals, kill -9, restarts, many workers."""

import contextlib
import os
import re
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
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.helpers import wait_for
from tests.redis_servers import RedisServer, free_port
from tests.worker_handlers import LOG_KEY, read_log

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
            # A group of its own, for stop() to end with any process it started (--reload
            # runs the worker in a child, which a kill of the command's process leaves alive).
            start_new_session=True,
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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
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


@pytest.fixture
def second_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.close()


def test_max_messages_is_exact_with_queues_fetching_at_the_same_moment(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    second_server: RedisServer,
    settings: Any,
) -> None:
    """--max-messages N handles exactly N messages, however many queues fetch at once: each
    fetch reserves its share of what is left before it goes out.

    Two queues with a backlog each; the second queue's fetch is held up by a CLIENT PAUSE of
    its server while the first queue's consumer fetches. Before, both counted on the same
    share: the first handled all 3, and the second's 2, fetched before the first's last
    was done, came on top of them."""
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "NACK_REDELIVERY_DELAY": 0},
        "second": {"URL": second_server.url, "NACK_REDELIVERY_DELAY": 0},
    }
    first, second = get_queue("default"), get_queue("second")
    worker = spawn(
        workers,
        redis_server.url,
        *("--max-messages", "3", "--concurrency", "2"),
        DQ_TEST_SECOND_REDIS_URL=second_server.url,
    )
    worker.wait_for_line("queue 'second'")
    time.sleep(0.3)  # both consumers' first fetches found nothing
    started = time.monotonic()
    second.send_many([{"n": n} for n in range(4)], delay=0.4)
    # Its fetch (of 2, the pool's room), due at 0.4 s, waits for the pause's end, at 1.5 s.
    second_server.client().client_pause(1500, all=False)
    time.sleep(max(0.9 - (time.monotonic() - started), 0))
    # Before, 2 fetched, done at 1.4 s, then 1, done at 1.9 s: after the second's fetch.
    first.send_many([{"n": n, "do": "sleep", "seconds": 0.5} for n in range(4)])

    assert worker.wait(timeout=20) == 0, worker.output
    done = [e for name in ("default", "second") for e in read_log(name) if e["event"] == "done"]
    assert len(done) == 3, worker.output
    assert "stopped: 3 handled, 0 failed." in worker.output
    left = [queue.stats() for queue in (first, second)]
    assert sum(stats["pending"] + stats["ready"] for stats in left) == 8 - 3
    assert [stats["unack"] for stats in left] == [0, 0]


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


def test_a_receiver_raising_system_exit_is_logged_and_the_worker_carries_on(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    worker = spawn(workers, redis_server.url, DQ_TEST_RECEIVER_EXITS="1")
    worker.wait_for_line("queue 'default'")
    first = queue.send({"n": 1})
    wait_for(lambda: events("acked"), timeout=20, what="the first ack's signal")
    second = queue.send({"n": 2})
    wait_for(lambda: len(events("acked")) == 2, timeout=20, what="the second message handled")

    # The receiver after the raising one was called each time, and the worker runs on.
    assert [e["id"] for e in events("acked")] == [first, second]
    assert worker.process.poll() is None, worker.output
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert worker.output.count("signal receiver <function exit_from_a_receiver") == 2
    assert "SystemExit: 3" in worker.output
    assert "stopped: 2 handled, 0 failed." in worker.output


def test_a_killed_worker_costs_one_attempt_of_each_delivery_it_held_and_no_more(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    # Short enough to wait out the killed worker's deliveries, long enough that the survivor
    # never times out its own on a loaded machine (that would charge more than the bound).
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=3, RETRY_COUNT=0)
    # 2 ms a message: the drain lasts seconds, so the kill always lands mid-drain (a fast
    # worker could otherwise finish all of them while a loaded machine kept this test waiting).
    ids = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.002} for n in range(3000)]))
    env = {"DQ_TEST_MAX_CONSUME": "3", "DQ_TEST_RETRY_COUNT": "0"}
    # The bound the docs give (what a crash costs): the larger of --batch-size and
    # --concurrency, per queue.
    batch_size, concurrency = 20, 2
    killed = spawn(
        workers,
        redis_server.url,
        "--batch-size",
        str(batch_size),
        "--concurrency",
        str(concurrency),
        **env,
    )
    client = redis_server.client()
    # Mid-drain: three log entries (start, done, acked) per message handled.
    wait_for(lambda: client.llen(LOG_KEY) > 1500, timeout=30, what="a few hundred handled")
    killed.signal(signal.SIGKILL)
    killed.wait(timeout=10)

    survivor = spawn(workers, redis_server.url, **env)

    def drained() -> bool:
        stats = queue.stats()
        return stats["pending"] + stats["ready"] + stats["retry"] + stats["unack"] == 0

    wait_for(drained, timeout=60, what="the queue drained")
    wait_for(lambda: queue.stats()["unannounced"] == 0, what="the exhaustions announced")
    charged = {entry.id for entry in queue.list_messages("garbage", limit=1000)}
    # What the killed worker held when it died: running, fetched ahead, or handled with the
    # ack not committed. Each used its only attempt; nothing else did, and nothing is lost.
    assert 1 <= len(charged) <= max(batch_size, concurrency), len(charged)
    started_by = {(e["id"], e["pid"]) for e in events("start")}
    assert {pid for message_id, pid in started_by if message_id in charged} <= {killed.pid}
    assert {e["id"] for e in events("done")} >= ids - charged
    exhausted = events("exhausted")
    assert {e["id"] for e in exhausted} == charged
    assert {e["pid"] for e in exhausted} == {survivor.pid}
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0


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


def test_a_worker_process_with_a_broken_handler_stops_at_once_naming_it(
    workers: list[WorkerProcess], redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "broken_handlers.py").write_text("import a_dependency_not_installed\n")
    worker = spawn(
        workers,
        redis_server.url,
        DQ_TEST_HANDLER="broken_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    assert worker.wait(timeout=30) == 1
    assert "(delayqueue_django.E020) DELAYQUEUES['default']['HANDLER'] is " in worker.output
    assert "raised ModuleNotFoundError: No module named 'a_dependency_not_installed'" in (
        worker.output
    )
    assert "Traceback" not in worker.output


@pytest.mark.parametrize("handler", ["", "root", "package"])
def test_each_log_line_prints_once_whatever_handlers_the_projects_logging_has(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any, handler: str
) -> None:
    """Before, with a console handler on the root logger in the project's LOGGING, every
    line printed twice: through it, and through the handler the command added."""
    message_id = queue_for(settings, redis_server.url).send({"n": 1})
    worker = spawn(
        workers,
        redis_server.url,
        "--burst",
        DJANGO_SETTINGS_MODULE="tests.logging_settings",
        DQ_TEST_LOGGING=handler,
    )
    assert worker.wait(timeout=30) == 0, worker.output
    [line] = [
        line for line in worker.output.splitlines() if f"handled message id={message_id} " in line
    ]
    # Through the project's handler where it has one, else the command's own.
    said_by = {"root": "ROOT DEBUG ", "package": "PACKAGE DEBUG "}.get(handler, "")
    assert line.startswith(said_by) if said_by else re.match(r"\d{4}-\d\d-\d\d ", line)


def test_a_worker_started_before_redis_says_so_once_and_then_that_it_connected(
    workers: list[WorkerProcess], settings: Any
) -> None:
    port = free_port()  # nothing listens there yet
    url = f"redis://127.0.0.1:{port}/0"
    # The default verbosity; heartbeats every 0.5 s meet the outage too.
    worker = spawn(workers, url, "-v", "1", "--heartbeat", "0.5")
    worker.wait_for_line(f"cannot reach Redis at 127.0.0.1:{port}, retrying: Error 111 ")
    # The banner could not read the queue's flow state, and says so.
    assert "\n    pause and run-time rate limit: unknown until Redis answers\n" in worker.output
    time.sleep(6)  # the consumer, its heartbeats and the wake-up listener all retry meanwhile
    server = RedisServer(port=port)
    try:
        worker.wait_for_line(f"connected to Redis at 127.0.0.1:{port} again, after ")
        queue = queue_for(settings, url)
        queue.send({"n": 1})
        wait_for(lambda: events("done"), timeout=20, what="the message handled")
        worker.wait_for_line("handled 1 message (0 failed) in the last ")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
    finally:
        server.close()
    warnings = [
        line.partition(": ")[2] for line in worker.output.splitlines() if " WARNING " in line
    ]
    # Before: 38 warnings of four kinds in 13 s, naming queues, and silence at the end.
    assert [warning.partition(", ")[0] for warning in warnings] == [
        f"cannot reach Redis at 127.0.0.1:{port}",
        f"connected to Redis at 127.0.0.1:{port} again",
    ], worker.output
    assert "handled message id=" not in worker.output  # one line per message is for -v 2


def handler_module(version: str) -> str:
    return (
        "from tests.worker_handlers import record\n\n\n"
        "def handle(message):\n"
        f"    record(message.queue, {version!r}, id=message.id)\n"
    )


def test_reload_restarts_the_worker_when_a_module_changes(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    module = tmp_path / "reloaded_handlers.py"
    module.write_text(handler_module("v1"))
    worker = spawn(
        workers,
        redis_server.url,
        "--reload",
        DQ_TEST_HANDLER="reloaded_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    worker.wait_for_line("queue 'default'")
    queue = queue_for(settings, redis_server.url)
    first = queue.send({"n": 1})
    wait_for(lambda: events("v1"), timeout=20, what="the first version's handler")

    changed = f"{module} changed: stopping the worker to restart it."

    def saved_again() -> bool:
        # The reloader compares each second's modification times with the last: an edit
        # before it first saw the file goes unnoticed, so the test saves until it is seen.
        module.write_text(handler_module("v2"))
        time.sleep(0.5)
        return changed in worker.output

    wait_for(saved_again, timeout=20, what="the change noticed")
    wait_for(lambda: worker.output.count("delayqueue_django worker ") == 2, what="a restart")
    second = queue.send({"n": 2})
    wait_for(lambda: events("v2"), timeout=20, what="the new version's handler")

    assert [e["id"] for e in events("v1")] == [first]
    assert [e["id"] for e in events("v2")] == [second]
    # The first worker stopped as on SIGTERM, in a process of its own, before the second.
    before_restart = worker.output.split(f"{module} changed")[1]
    assert "stopped: 1 handled, 0 failed." in before_restart.split("delayqueue_django worker")[0]
    pids = {int(pid) for pid in re.findall(r"delayqueue_django worker [^:]+:(\d+):", worker.output)}
    assert len(pids) == 2
    assert worker.pid not in pids  # the command's own process only watches
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    wait_for(lambda: not any(alive(pid) for pid in pids), what="the worker processes gone")


def test_reload_waits_for_a_fix_when_the_handler_module_fails_to_import(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    module = tmp_path / "reloaded_handlers.py"
    module.write_text("def handle(message)\n")  # a syntax error
    worker = spawn(
        workers,
        redis_server.url,
        "--reload",
        DQ_TEST_HANDLER="reloaded_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    worker.wait_for_line("The worker starts again when a file is saved.")
    assert "raised SyntaxError: expected ':' (reloaded_handlers.py, line 1)" in worker.output
    assert worker.process.poll() is None  # still watching

    def fixed() -> bool:
        module.write_text(handler_module("fixed"))  # saved until seen (see above)
        time.sleep(0.5)
        return "delayqueue_django worker " in worker.output

    wait_for(fixed, timeout=20, what="the worker started after the fix")
    message_id = queue_for(settings, redis_server.url).send({"n": 1})
    wait_for(lambda: events("fixed"), timeout=20, what="the fixed handler")
    assert [e["id"] for e in events("fixed")] == [message_id]
    worker.signal(signal.SIGTERM)  # the command's process takes its worker along
    assert worker.wait(timeout=20) == 0
    pids = {int(pid) for pid in re.findall(r"delayqueue_django worker [^:]+:(\d+):", worker.output)}
    wait_for(lambda: not any(alive(pid) for pid in pids), what="the worker process gone")


def test_reload_is_refused_with_burst_or_max_messages(redis_server: RedisServer) -> None:
    for option in ({"burst": True}, {"max_messages": 3}):
        with pytest.raises(CommandError, match="cannot be combined with --burst or --max-"):
            call_command("run_delayqueue", reload=True, **option)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
        assert f"cannot reach Redis at 127.0.0.1:{server.port}, retrying: " in worker.output
        assert f"connected to Redis at 127.0.0.1:{server.port} again, after " in worker.output
    finally:
        server.close()


def persisted_server() -> RedisServer:
    """A server whose data outlives a stop and start (an append-only file)."""
    return RedisServer("--appendonly", "yes")


def test_a_burst_run_gives_up_on_a_redis_that_stays_away(
    workers: list[WorkerProcess], settings: Any
) -> None:
    server = persisted_server()
    try:
        queue = queue_for(settings, server.url)
        message_id = queue.send({"n": 1})
        server.stop()
        worker = spawn(workers, server.url, "-v", "1", "--burst", "--give-up-after", "2")
        worker.wait_for_line(f"cannot reach Redis at 127.0.0.1:{server.port}, retrying: ")
        away = time.monotonic()
        # Before: it retried until killed.
        assert worker.wait(timeout=12) == 3
        assert time.monotonic() - away < 2 + 4
        line = (
            f"cannot reach Redis at 127.0.0.1:{server.port} for 2 s: a --burst run gives up; "
            "the messages stay in Redis"
        )
        assert worker.output.count(line) == 1, worker.output
        assert "still cannot reach" not in worker.output
        server.start()
        stored = queue.peek(message_id)
        assert stored is not None
        assert stored.state == "pending"  # never fetched: due, as it was sent
    finally:
        server.close()


def test_a_burst_run_goes_on_when_redis_comes_back_in_time(
    workers: list[WorkerProcess], settings: Any
) -> None:
    server = persisted_server()
    try:
        queue = queue_for(settings, server.url)
        ids = queue.send_many([{"n": 1}, {"n": 2}])
        server.stop()
        worker = spawn(workers, server.url, "-v", "1", "--burst", "--give-up-after", "8")
        worker.wait_for_line(f"cannot reach Redis at 127.0.0.1:{server.port}, retrying: ")
        server.start()
        assert worker.wait(timeout=20) == 0, worker.output
        assert sorted(e["id"] for e in events("done")) == sorted(ids)
        assert "gives up" not in worker.output
    finally:
        server.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_a_burst_run_that_gives_up_holding_a_verdict_stops_at_once_and_the_message_comes_back(
    workers: list[WorkerProcess], settings: Any, shards: int
) -> None:
    """Redis stops while a handler runs: its verdict cannot be committed. Once the run gives
    up, no handler runs: it stops then, saying what it could not commit, rather than wait
    out --grace and warn of handlers still running (before: 20 s, and that warning). The
    delivery comes back after its lease, once. (A queue of shards holds a failed commit
    back instead of raising: the other path to the same end.)"""
    server = persisted_server()
    try:
        queue = queue_for(settings, server.url, MAX_CONSUME_DURATION=4, SHARDS=shards)
        message_id = queue.send({"do": "sleep-first", "seconds": 1.0})
        worker = spawn(
            workers,
            server.url,
            *("-v", "1", "--burst", "--give-up-after", "1", "--grace", "20"),
            DQ_TEST_MAX_CONSUME="4",
            DQ_TEST_SHARDS=str(shards),
        )
        wait_for(lambda: events("start"), timeout=20, what="the handler to start")
        server.stop()  # the handler's verdict, due in 1 s, finds Redis gone
        away = time.monotonic()
        assert worker.wait(timeout=40) == 3, worker.output
        assert time.monotonic() - away < 1 + 1 + 5, worker.output
        assert "still running" not in worker.output
        assert (
            "could not commit 1 verdict queue=default: Redis unreachable; those messages are "
            "delivered again after their lease (MAX_CONSUME_DURATION)"
        ) in worker.output

        server.start()
        stored = queue.peek(message_id)
        assert stored is not None
        assert (stored.state, stored.attempt) == ("unack", 1)  # leased still: nothing lost
        again = spawn(workers, server.url, DQ_TEST_MAX_CONSUME="4", DQ_TEST_SHARDS=str(shards))
        wait_for(lambda: events("done"), timeout=20, what="the delivery after the lease")
        again.signal(signal.SIGTERM)
        assert again.wait(timeout=20) == 0, again.output
        assert [(e["id"], e["attempt"]) for e in events("start")] == [
            (message_id, 1),
            (message_id, 2),
        ]
        assert [e["id"] for e in events("acked")] == [message_id]  # nothing twice
        assert queue.peek(message_id) is None
    finally:
        server.close()


def test_a_stop_whose_grace_ends_with_only_verdicts_held_says_so(
    workers: list[WorkerProcess], settings: Any
) -> None:
    """SIGTERM while Redis is away and a verdict waits for it: the grace ends with no handler
    running, and the warning says what is left (before: "handlers still running")."""
    server = persisted_server()
    try:
        queue = queue_for(settings, server.url)
        queue.send({"do": "sleep", "seconds": 0.5})
        worker = spawn(workers, server.url, "-v", "1", "--grace", "1")
        wait_for(lambda: events("start"), timeout=20, what="the handler to start")
        server.stop()
        worker.wait_for_line("handler failed")  # its "done" record found Redis gone
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0, worker.output
        assert "still running" not in worker.output
        assert "verdicts still not committed after the 1 s grace period" in worker.output
    finally:
        server.close()


def test_give_up_after_is_refused_without_burst(redis_server: RedisServer) -> None:
    with pytest.raises(CommandError, match="--give-up-after is for --burst"):
        call_command("run_delayqueue", give_up_after=5.0)


def test_several_worker_processes_share_a_queue_without_duplicates(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    for _ in range(3):
        spawn(workers, redis_server.url, "--concurrency", "2")
    # All of them listening first: on a loaded machine one worker could start seconds before
    # the others and drain the whole queue alone, which would test nothing about sharing.
    for worker in workers:
        worker.wait_for_line("queue 'default'")
    # 2 ms a message, so no one worker can drain them all before the others' first fetch.
    work = {"do": "sleep", "seconds": 0.002}
    ids = queue.send_many([{"n": n, **work} for n in range(300)], delay=0.5)
    ids += queue.send_many([{"n": n, **work} for n in range(300, 600)])
    wait_for(lambda: len(events("done")) >= 600, timeout=60, what="all 600 handled")
    handled = Counter(e["id"] for e in events("done"))
    assert set(handled) == set(ids)
    assert max(handled.values()) == 1  # no timeouts, so no duplicates
    assert len({e["pid"] for e in events("done")}) >= 2
    for worker in workers:
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
