"""The worker on a Redis that refuses writes or cannot be reached: housekeeping and
announcements never hold up deliveries, and waiting for Redis really backs off."""

import logging
import threading
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from delayqueue_django import get_queue
from delayqueue_django.exceptions import RedisOutOfMemory
from delayqueue_django.message import Message
from delayqueue_django.worker import Worker
from tests.redis_servers import RedisServer, free_port

pytestmark = pytest.mark.timeout(30)

HANDLED: list[Any] = []


def remember(message: Message) -> bool:
    """Records in this process: a handler writing to the full Redis would fail itself."""
    HANDLED.append(message.payload)
    return bool(message.payload != "refuse")  # refused with no retry left: a dead letter


@pytest.fixture
def full_redis(settings: Any) -> Iterator[RedisServer]:
    server = RedisServer("--maxmemory-policy", "noeviction")
    settings.DELAYQUEUES = {
        "default": {
            "URL": server.url,
            "HANDLER": "tests.test_worker_faults.remember",
            "RETRY_COUNT": 0,
        }
    }
    HANDLED.clear()
    yield server
    server.close()


def squeeze(server: RedisServer) -> None:
    """maxmemory below what Redis uses: every write that needs memory is refused."""
    client = server.client()
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 100_000)
    client.close()


def test_a_worker_drains_a_redis_that_is_out_of_memory(full_redis: RedisServer) -> None:
    queue = get_queue()
    queue.send_many([f"pad {n} " + "x" * 10_000 for n in range(100)])
    squeeze(full_redis)
    with pytest.raises(RedisOutOfMemory):
        queue.send("refused")

    # The heartbeat's SET is refused; fetch and ack are not, and they free memory.
    call_command("run_delayqueue", burst=True, heartbeat=0.1, stdout=StringIO())

    assert len(HANDLED) == 100
    assert queue.check_invariants().messages == 0
    assert queue.send("accepted again")


def test_an_exhaustion_that_cannot_be_claimed_waits_without_holding_up_deliveries(
    full_redis: RedisServer,
) -> None:
    queue = get_queue()
    queue.send_many(["refuse", *(f"small {n}" for n in range(20))])
    squeeze(full_redis)  # the acks of small messages free too little to claim anything

    call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert len(HANDLED) == 21
    stats = queue.stats()
    assert (stats["pending"], stats["unack"], stats["garbage"]) == (0, 0, 1)
    assert stats["unannounced"] == 1  # still owed

    full_redis.client().config_set("maxmemory", 0)
    call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert queue.stats()["unannounced"] == 0


def test_waiting_for_an_unreachable_redis_backs_off(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    settings.DELAYQUEUES = {"default": {"URL": url, "HANDLER": "tests.test_worker_faults.remember"}}
    worker = Worker([(get_queue(), remember)], heartbeat_interval=0.5)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        runner = threading.Thread(target=worker.run)
        runner.start()
        time.sleep(4)  # the consumer first waits up to 2 s for its wake-up subscription
        worker.request_stop()
        runner.join(timeout=10)
    unavailable = [r for r in caplog.records if "redis unavailable" in r.getMessage()]
    # Backoff from 0.1 s, doubling: a handful of tries in about 2 s, not a busy loop.
    assert 2 <= len(unavailable) <= 8
