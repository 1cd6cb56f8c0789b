"""Attempt records with real worker processes (``manage.py run_delayqueue``) on Redis: a
worker killed (-9) between its handler and the verdict leaves no record, and the
redelivery's record is the next attempt, written by the worker that ran it."""

import signal
import socket
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.redis_servers import RedisServer
from tests.test_worker_processes import WorkerProcess, events, queue_for, spawn, workers  # noqa: F401

pytestmark = pytest.mark.timeout(90)


def test_a_kill_9_before_the_verdict_leaves_no_record(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    queue = queue_for(settings, redis_server.url, MAX_CONSUME_DURATION=1, RETRY_COUNT=1)
    message_id = queue.send({"do": "sleep-first", "seconds": 30, "then": "raise"})
    first = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", DQ_TEST_RETRY_COUNT="1")
    wait_for(lambda: events("start"), timeout=20, what="the handler to start")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    # Killed mid-handler: no verdict, so no record (until its lease runs out, which is one).
    assert queue.history(message_id) == []

    second = spawn(workers, redis_server.url, DQ_TEST_MAX_CONSUME="1", DQ_TEST_RETRY_COUNT="1")
    records = wait_for(
        lambda: len(queue.history(message_id)) == 2 and queue.history(message_id),
        timeout=30,
        what="the redelivery's record",
    )
    assert [(r.attempt, r.verdict) for r in records] == [(1, "lease expired"), (2, "error")]
    assert records[0].worker == ""
    assert records[1].worker == f"{socket.gethostname()}:{second.pid}"
    assert records[1].error == "handler failed on purpose"
    assert records[1].traceback.rstrip().endswith("RuntimeError: handler failed on purpose")
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"
    assert stored.last_error == records[1]
