"""``run_delayqueue --processes``: a supervisor and its worker processes, as real processes
with real signals."""

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django.management.commands.run_delayqueue import process_count
from delayqueue_django.worker import heartbeat, supervisor
from delayqueue_django.worker.supervisor import Supervisor
from delayqueue_django.worker.supervisor.link import SUPERVISOR_FD_ENV
from tests.helpers import wait_for
from tests.redis_servers import RedisServer
from tests.test_worker_processes import (
    ROOT,
    WorkerProcess,
    alive,
    events,
    handler_module,
    queue_for,
    spawn,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def workers(redis_server: RedisServer) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()  # the command's process group: the supervisor and its children


def children_of(worker: WorkerProcess) -> list[int]:
    """The pids of the worker processes the supervisor started (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[1]) == worker.pid:
            found.append(int(entry.name))
    return sorted(found)


def ready_children(worker: WorkerProcess, count: int) -> list[int]:
    """Wait until ``count`` worker processes printed their banner; their pids."""
    wait_for(
        lambda: len(re.findall(r"delayqueue_django worker \S+:(\d+):", worker.output)) >= count,
        timeout=30,
        what=f"{count} worker banners",
    )
    pids: list[int] = wait_for(
        lambda: len(children_of(worker)) == count and children_of(worker), timeout=10
    )
    return pids


def test_two_processes_drain_a_queue_and_stop_cleanly_on_sigterm(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    ids = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.01} for n in range(200)]))
    worker = spawn(workers, redis_server.url, "--processes", "2", "--batch-size", "5")
    pids = ready_children(worker, 2)
    wait_for(lambda: {e["id"] for e in events("acked")} == ids, timeout=30, what="the drain")
    # Both took part: the messages were shared.
    assert {e["pid"] for e in events("done")} == set(pids)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    # Its last word, once its worker processes are gone.
    assert re.search(
        r"\nSupervisor \S+ stopped: every worker process finished its running handlers\.\n$",
        worker.output,
    ), worker.output


def test_a_child_killed_mid_drain_is_replaced_and_nothing_is_lost_or_burned(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=2, RETRY_COUNT=3)
    ids = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.005} for n in range(600)]))
    worker = spawn(
        workers, redis_server.url, "--processes", "2", "--batch-size", "5", DQ_TEST_MAX_CONSUME="2"
    )
    first, second = ready_children(worker, 2)
    wait_for(lambda: len(events("done")) > 100, timeout=30, what="a hundred handled")
    os.kill(first, signal.SIGKILL)
    worker.wait_for_line(f"worker process pid {first} died (killed by SIGKILL)")

    def drained() -> bool:
        stats = queue.stats()
        return stats["pending"] + stats["ready"] + stats["retry"] + stats["unack"] == 0

    # (Not by the acks' signals: the killed process may have died between an ack and its
    # signal.)
    wait_for(drained, timeout=60, what="the drain")
    assert {e["id"] for e in events("done")} == ids
    started = events("start")
    # A replacement joined in. (Whether it handled any of the 600 depends on how fast the
    # survivor drained them while it started: messages sent once it runs tell.)
    [replacement] = wait_for(
        lambda: [pid for pid in children_of(worker) if pid not in (first, second)],
        timeout=30,
        what="the replacement process",
    )
    ready_children(worker, 2)
    later = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.05} for n in range(40)]))
    wait_for(lambda: {e["id"] for e in events("done")} >= later, timeout=30, what="the later")
    assert replacement in {e["pid"] for e in events("start") if e["id"] in later}, worker.output
    # Nothing burned: what the killed process held came back for another attempt, never
    # to the dead letters.
    assert queue.stats()["garbage"] == 0
    assert max(e["attempt"] for e in started) <= 2
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    assert "restart 1)" in worker.output


def test_sigterm_lets_running_handlers_finish_within_the_grace(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    slow = set(queue.send_many([{"do": "sleep", "seconds": 1.5} for _ in range(2)]))
    worker = spawn(workers, redis_server.url, "--processes", "2", "--grace", "5")
    ready_children(worker, 2)
    wait_for(lambda: len(events("start")) == 2, timeout=20, what="both handlers started")
    stopped = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    assert time.monotonic() - stopped < 5
    assert {e["id"] for e in events("acked")} == slow


def test_sigterm_while_the_children_start_is_a_clean_stop(
    workers: list[WorkerProcess], redis_server: RedisServer
) -> None:
    # Before a child has its signal handlers (it says "ready" then), SIGTERM ends it as
    # Python's default does: it had fetched nothing, so the command still exits 0. (CI saw
    # a --max-memory replacement, stopped while it started, fail the command's exit.)
    worker = spawn(workers, redis_server.url, "--processes", "2")
    worker.wait_for_line("starting 2 worker processes", timeout=20)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output


def test_a_second_signal_stops_the_children_at_once(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    queue.send({"do": "sleep", "seconds": 30})
    worker = spawn(workers, redis_server.url, "--processes", "2")
    ready_children(worker, 2)
    wait_for(lambda: events("start"), timeout=20, what="the handler started")
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    stopped = time.monotonic()
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=10) == 1, worker.output
    assert time.monotonic() - stopped < 5
    # Asked for, so said as such: no CommandError, no worker process reported as failing.
    assert "Error" not in worker.output, worker.output
    assert "stopped: exit status" not in worker.output
    assert worker.output.count("leave now") == 1  # the signal's line, not a second one
    assert "stopped at once (a second stop request): running handlers were cut short" in (
        worker.output
    )


def test_a_bad_handler_path_stops_the_command_with_one_clear_line(
    workers: list[WorkerProcess], redis_server: RedisServer
) -> None:
    worker = spawn(
        workers, redis_server.url, "--processes", "2", DQ_TEST_HANDLER="tests.no_such.handle"
    )
    assert worker.wait(timeout=30) == 1
    # The system check's error, once: found by the supervisor, before any worker process.
    errors = [line for line in worker.output.splitlines() if "(delayqueue_django.E" in line]
    assert len(errors) == 1, worker.output
    assert "DELAYQUEUES['default']['HANDLER'] is 'tests.no_such.handle'" in errors[0]
    assert "delayqueue_django worker" not in worker.output  # no worker process started


def test_a_child_that_cannot_start_stops_the_command_instead_of_looping(
    workers: list[WorkerProcess], redis_server: RedisServer, tmp_path: Path
) -> None:
    # The supervisor's own check passes; the worker processes' import of the handler fails
    # (a module that fails only in a fresh interpreter: here, where an env var says so).
    (tmp_path / "flaky_handlers.py").write_text(
        "import os\n"
        "if os.environ.get('DELAYQUEUE_SUPERVISOR_FD'):\n"
        "    raise ImportError('only in worker processes')\n"
        "def handle(message):\n"
        "    pass\n"
    )
    worker = spawn(
        workers,
        redis_server.url,
        "--processes",
        "2",
        DQ_TEST_HANDLER="flaky_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    assert worker.wait(timeout=30) == 1, worker.output
    assert "could not start (exit status 1)" in worker.output
    assert "only in worker processes" in worker.output
    assert "starting another" not in worker.output


def test_sighup_during_a_drain_replaces_every_child_and_no_message_runs_twice(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    ids = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.01} for n in range(500)]))
    worker = spawn(workers, redis_server.url, "--processes", "2", "--batch-size", "10")
    old = ready_children(worker, 2)
    wait_for(lambda: len(events("done")) > 50, timeout=30, what="fifty handled")
    worker.signal(signal.SIGHUP)
    worker.wait_for_line("reload done", timeout=60)
    wait_for(lambda: {e["id"] for e in events("acked")} >= ids, timeout=60, what="the drain")
    # The last old process may still be on its way out.
    new = wait_for(lambda: len(children_of(worker)) == 2 and children_of(worker), timeout=20)
    assert not set(new) & set(old)
    started = events("start")
    # Each message ran exactly once, by the old processes or the new ones. (Which of them
    # handled the 500 depends on how fast each drained while the others started: messages
    # sent once the reload is done tell that the new ones work.)
    assert {e["pid"] for e in started} <= set(old) | set(new), worker.output
    assert len(started) == len({e["id"] for e in started}) == len(ids)
    later = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.05} for n in range(40)]))
    wait_for(lambda: {e["id"] for e in events("acked")} >= later, timeout=30, what="the later")
    assert {e["pid"] for e in events("start") if e["id"] in later} <= set(new), worker.output
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output


def test_a_child_over_max_memory_is_replaced_after_its_handler_finishes(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    worker = spawn(workers, redis_server.url, "--processes", "1", "--max-memory", "200")
    [first] = ready_children(worker, 1)
    # 250 MB more, then half a second of work, which the process may be running when the
    # supervisor (looking once a second) sees it over the limit: it stops gracefully.
    grown = queue.send({"do": "grow", "mb": 250})
    after = queue.send({"do": "sleep", "seconds": 0.5}, delay=0.2)
    worker.wait_for_line(f"worker process pid {first} holds ", timeout=30)
    wait_for(lambda: {e["id"] for e in events("acked")} == {grown, after}, timeout=30)
    [second] = wait_for(lambda: [p for p in children_of(worker) if p != first], timeout=20)
    wait_for(lambda: first not in children_of(worker), timeout=20, what="the old process gone")
    worker.wait_for_line(f"worker process pid {first} stopped (--max-memory): exit status 0")
    assert "over --max-memory 200: replacing it" in worker.output
    assert len(events("start")) == 2  # each ran once, none cut short
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output
    assert second != first


def test_max_messages_recycles_a_child_and_the_queue_keeps_flowing(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    ids = set(queue.send_many([{"n": n} for n in range(12)]))
    worker = spawn(
        workers, redis_server.url, "--processes", "1", "--max-messages", "5", "--batch-size", "2"
    )
    wait_for(lambda: {e["id"] for e in events("acked")} == ids, timeout=40, what="the drain")
    assert len({e["pid"] for e in events("start")}) == 3
    assert worker.output.count("finished its run; starting another") >= 2
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output


def test_a_handler_past_its_time_limit_is_stopped_and_retried(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url, TIME_LIMIT=2, MAX_CONSUME_DURATION=10)
    stuck = queue.send({"do": "sleep-first", "seconds": 3600})
    waiting = queue.send({"n": "behind it"}, delay=0.05)
    time.sleep(0.1)
    worker = spawn(
        workers,
        redis_server.url,
        *("--processes", "1", "--batch-size", "2"),
        DQ_TEST_TIME_LIMIT="2",
        DQ_TEST_MAX_CONSUME="10",
    )
    [first] = ready_children(worker, 1)
    [began] = wait_for(lambda: events("start"), timeout=20, what="the handler started")

    def listed(pid: int) -> list[dict[str, Any]]:
        return [w for w in heartbeat.live_workers(queue) if w.get("pid") == pid]

    assert listed(first)  # (its heartbeat lives 30 s: three of its 10 s intervals)
    [nacked] = wait_for(lambda: events("nacked"), timeout=10, what="the refusal")
    # Killed, it is no longer listed as a live worker running its handler: its supervisor
    # removed its heartbeat at once.
    wait_for(lambda: not listed(first), timeout=3, what="the killed process unlisted")
    assert nacked["id"] == stuck
    assert "time limit" in nacked["error"]
    # Stopped within 3 s of its start (2 s of limit, then the kill and the refusal).
    assert time.time() - began["at"] < 3 + 0.5
    retried = wait_for(
        lambda: [e for e in events("done") if e["id"] == stuck], timeout=20, what="the retry"
    )
    assert retried[0]["attempt"] == 2
    # The message fetched behind it was handed back, not left to its lease: its only
    # delivery is its first, in the replacement, long before the 10 s lease ended.
    wait_for(lambda: [e for e in events("start") if e["id"] == waiting], timeout=5)
    behind = [e for e in events("start") if e["id"] == waiting]
    assert [(e["attempt"], e["pid"] != first) for e in behind] == [(1, True)]
    assert "ran past its TIME_LIMIT of 2 s" in worker.output
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output


def test_reload_with_processes_restarts_every_worker_process_on_a_change(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    module = tmp_path / "reloaded_handlers.py"
    module.write_text(handler_module("v1"))
    worker = spawn(
        workers,
        redis_server.url,
        *("--reload", "--processes", "2"),
        DQ_TEST_HANDLER="reloaded_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    wait_for(lambda: worker.output.count("queue 'default'") == 2, timeout=30, what="2 workers")
    queue = queue_for(settings, redis_server.url)
    first = queue.send({"n": 1})
    wait_for(lambda: events("v1"), timeout=20, what="the first version's handler")
    changed = f"{module} changed: stopping the workers to restart them."

    def saved_again() -> bool:
        # Saved until the reloader, which compares modification times each second, sees it.
        module.write_text(handler_module("v2"))
        time.sleep(0.5)
        return changed in worker.output

    wait_for(saved_again, timeout=20, what="the change noticed")
    wait_for(lambda: worker.output.count("queue 'default'") == 4, timeout=30, what="a restart")
    second = queue.send({"n": 2})
    wait_for(lambda: events("v2"), timeout=20, what="the new version's handler")
    assert [e["id"] for e in events("v1")] == [first]
    assert [e["id"] for e in events("v2")] == [second]
    pids = {int(pid) for pid in re.findall(r"delayqueue_django worker [^:]+:(\d+):", worker.output)}
    assert len(pids) == 4
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=20, what="the workers gone")


def test_a_burst_drains_with_every_process_and_exits_0(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    ids = set(queue.send_many([{"n": n, "do": "sleep", "seconds": 0.01} for n in range(100)]))
    worker = spawn(workers, redis_server.url, "--processes", "2", "--burst", "--batch-size", "5")
    assert worker.wait(timeout=60) == 0, worker.output
    assert {e["id"] for e in events("acked")} == ids
    assert worker.output.count(" is done: exit status 0") == 2
    assert "done: every worker process finished its burst." in worker.output


def test_worker_processes_stop_gracefully_when_their_supervisor_is_killed(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any
) -> None:
    queue = queue_for(settings, redis_server.url)
    worker = spawn(workers, redis_server.url, "--processes", "2")
    pids = ready_children(worker, 2)
    running = queue.send({"do": "sleep", "seconds": 1})
    wait_for(lambda: events("start"), timeout=20, what="the handler started")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids),
        timeout=20,
        what="the orphaned worker processes gone",
    )
    # Gracefully: the running handler finished and its ack was committed.
    assert [e["id"] for e in events("acked")] == [running]
    assert "the supervisor (pid" in worker.output


def test_processes_and_max_memory_are_refused_where_they_cannot_work(
    redis_server: RedisServer, settings: Any
) -> None:
    queue_for(settings, redis_server.url)
    with pytest.raises(CommandError, match="--max-memory is for --processes"):
        call_command("run_delayqueue", max_memory=100, burst=True)
    with pytest.raises(CommandError, match="--processes starts processes of its own"):
        call_command("run_delayqueue", processes=2, burst=True)


def test_processes_auto_is_the_usable_cores() -> None:
    assert process_count("auto") == len(os.sched_getaffinity(0))
    assert process_count("3") == 3
    with pytest.raises(argparse.ArgumentTypeError):
        process_count("0")


def test_a_reload_whose_new_process_cannot_start_keeps_the_old_ones(
    workers: list[WorkerProcess], redis_server: RedisServer, settings: Any, tmp_path: Path
) -> None:
    module = tmp_path / "deployed_handlers.py"
    module.write_text(handler_module("v1"))
    worker = spawn(
        workers,
        redis_server.url,
        "--processes",
        "1",
        DQ_TEST_HANDLER="deployed_handlers.handle",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    [old] = ready_children(worker, 1)
    module.write_text("raise ImportError('a broken deploy')\n")
    worker.signal(signal.SIGHUP)
    worker.wait_for_line("reload: the new worker process pid ")
    assert "could not start (exit status 1); the old ones go on" in worker.output
    assert "a broken deploy" in worker.output
    # The old process still handles messages, and the command still runs.
    message_id = queue_for(settings, redis_server.url).send({"n": 1})
    [handled] = wait_for(lambda: events("v1"), timeout=20, what="the old process's handler")
    assert (handled["id"], handled["pid"]) == (message_id, old)
    assert children_of(worker) == [old]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output


def test_a_max_memory_below_a_fresh_process_is_refused_at_start(
    workers: list[WorkerProcess], redis_server: RedisServer
) -> None:
    # Before, every worker process was replaced about once a second, for ever, as a fresh
    # one holds some 60 MB.
    worker = spawn(workers, redis_server.url, "--processes", "2", "--max-memory", "20")
    assert worker.wait(timeout=30) == 1, worker.output
    assert "--max-memory 20 is below what a fresh worker process holds: this supervisor" in (
        worker.output
    )
    assert "delayqueue_django worker" not in worker.output  # no worker process started
    assert "replacing it" not in worker.output


FAKE_CHILD = f"""
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *args: sys.exit(0))
link = socket.socket(fileno=int(os.environ[{SUPERVISOR_FD_ENV!r}]))
link.sendall(b'{{"event": "ready", "worker_id": "fake"}}\\n')
time.sleep(60)
"""


def test_replacements_for_memory_back_off_while_processes_pass_the_limit_young(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where a fresh process holds about the limit (the supervisor's own size, checked at
    start, may be just under it), the replacements back off as the restarts of processes
    that keep dying do, instead of one each second for ever."""
    monkeypatch.setattr(supervisor, "MEMORY_CHECK_SECONDS", 0.05)
    # Processes that only say they are ready: each holds more than 1 MB.
    watched = Supervisor(
        processes=1,
        argv=[sys.executable, "-c", FAKE_CHILD],
        env=dict(os.environ),
        queues=[],
        grace=1,
        max_memory_mb=1,
    )

    def replaced() -> int:
        return sum("over --max-memory 1: replacing it" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        running = threading.Thread(target=watched.run)
        running.start()
        try:
            wait_for(lambda: replaced() >= 3, timeout=20, what="three replacements")
            # The next waits 2 s, the one after 4 s; before, each process was replaced as
            # soon as it was ready.
            time.sleep(3)
            assert replaced() <= 4
        finally:
            watched.request_stop()
            running.join(timeout=20)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "replacing processes for their size backs off" in warnings[0]
    assert "raise --max-memory" in warnings[0]


def test_a_supervisor_at_rest_looks_at_its_children_once_a_second_and_at_once_on_news(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At rest it waits for news (a child exiting or ready, a request) or a timed duty,
    instead of polling every child 20 times a second: most of an idle command's CPU. Looks
    counted, not timed: a child's exit is taken in at the look it causes."""
    watched = Supervisor(
        processes=2,
        argv=[sys.executable, "-c", FAKE_CHILD],
        env=dict(os.environ),
        queues=[],
        grace=1,
        heartbeat_interval=60,
    )
    looks = 0
    reap = watched._reap

    def counted(*, stopping: bool) -> bool:
        nonlocal looks
        looks += 1
        return reap(stopping=stopping)

    monkeypatch.setattr(watched, "_reap", counted)
    running = threading.Thread(target=watched.run)
    running.start()
    try:
        wait_for(
            lambda: len(watched.children) == 2 and all(c.ready.is_set() for c in watched.children),
            timeout=20,
            what="two ready children",
        )
        first = watched.children[0]
        time.sleep(0.5)  # past the looks of the start
        before = looks
        time.sleep(3)
        assert looks - before <= 5  # about once a second, where it was 60 times
        # A child that exits is taken in and replaced at the look its exit causes.
        before = looks
        first.process.kill()
        wait_for(lambda: first not in watched.children, timeout=10, what="the child reaped")
        assert looks - before <= 2
        wait_for(lambda: len(watched.children) == 2, timeout=10, what="its replacement")
    finally:
        watched.request_stop()
        running.join(timeout=20)
    assert not running.is_alive()
