"""The worker on a Redis that refuses writes, cannot be reached or stalls: housekeeping and
announcements never hold up deliveries, waiting for Redis really backs off, and a verdict
whose call failed, or whose reply was lost after Redis ran it, is committed, counted and
signalled exactly once."""

import logging
import re
import threading
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from delayqueue_django import get_queue, signals
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import QueueUnavailable, RedisOutOfMemory
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
    port = free_port()  # nobody listens there
    url = f"redis://127.0.0.1:{port}/0"
    settings.DELAYQUEUES = {"default": {"URL": url, "HANDLER": "tests.test_worker_faults.remember"}}
    worker = Worker([(get_queue(), remember)], heartbeat_interval=0.5)
    with caplog.at_level(logging.DEBUG, logger="delayqueue_django.worker"):
        runner = threading.Thread(target=worker.run)
        runner.start()
        time.sleep(4)  # the consumer first waits up to 2 s for its wake-up subscription
        worker.request_stop()
        runner.join(timeout=10)
    tries = [r for r in caplog.records if r.getMessage().startswith("redis unavailable")]
    # Backoff from 0.1 s, doubling: a handful of tries in about 2 s, not a busy loop; each
    # one logged at debug level only.
    assert 2 <= len(tries) <= 8
    assert {r.levelno for r in tries} == {logging.DEBUG}
    # The outage itself is said once, by whichever thread met it first.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"cannot reach Redis at 127.0.0.1:{port}, retrying: Error 111 ")


# Stalling Redis for a second, longer than the queue client's socket timeout: the call in
# progress times out. With DEBUG SLEEP Redis runs it when it wakes (the reply is lost); with
# CLIENT PAUSE it never runs (its client has hung up by the end of the pause).
STALL_SECONDS = 1.0


@pytest.fixture
def stalling_redis(settings: Any) -> Iterator[RedisServer]:
    server = RedisServer("--enable-debug-command", "yes")
    settings.DELAYQUEUES = {
        "default": {
            "URL": server.url,
            "RETRY_COUNT": 0,
            # No re-sending by redis-py: the worker's own repeat is what is tested here.
            "OPTIONS": {"socket_timeout": 0.3, "retry": Retry(NoBackoff(), 0)},
        }
    }
    yield server
    server.close()


def load_scripts(queue: Queue) -> None:
    """Verdicts on nothing, to load their scripts: a stalled first call would otherwise only
    meet NOSCRIPT when Redis wakes, and do its work when sent again."""
    queue.store.ack([("nothing", 0)])
    queue.store.nack([("nothing", 0, 0)])
    queue.store.release([("nothing", 0)])


def stall(server: RedisServer, how: str) -> None:
    """Stall Redis from now on for STALL_SECONDS ("sleep" or "pause"); returns once it is."""
    admin: Any = server.client(socket_timeout=STALL_SECONDS + 5)
    if how == "pause":
        admin.execute_command("CLIENT", "PAUSE", int(STALL_SECONDS * 1000), "ALL")
        return
    sleeper = threading.Thread(
        target=admin.execute_command, args=("DEBUG", "SLEEP", STALL_SECONDS), daemon=True
    )
    sleeper.start()
    probe = server.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
    while True:  # until Redis stops answering: the sleep is under way
        try:
            probe.ping()
        except RedisError:
            return
        time.sleep(0.01)


def run_to_the_end(worker: Worker, timeout: float = 15) -> None:
    """Run a --burst worker in a thread; fail if it does not finish."""
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(timeout)
    if runner.is_alive():
        worker.request_stop()
        worker.request_stop()
        raise AssertionError(f"the burst run did not end within {timeout} s")


class Signalled:
    """What the worker's signals announced, by kind, while connected."""

    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = {"acked": [], "nacked": [], "exhausted": []}
        self._receivers = {
            signals.message_acked: self._receiver("acked"),
            signals.message_nacked: self._receiver("nacked"),
            signals.message_exhausted: self._receiver("exhausted"),
        }

    def _receiver(self, kind: str) -> Any:
        def receive(*, message: Any, **kwargs: Any) -> None:
            self.ids[kind].append(message.id)

        return receive

    def __enter__(self) -> "Signalled":
        for signal, receiver in self._receivers.items():
            signal.connect(receiver)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signal, receiver in self._receivers.items():
            signal.disconnect(receiver)


@pytest.mark.parametrize("how", ["pause", "sleep"])
def test_a_flush_failing_half_way_counts_what_it_committed_and_repeats_the_rest(
    stalling_redis: RedisServer,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from delayqueue_django.worker.consumer import state as consumer_state

    # Both verdicts in one flush: the ack is committed, then the nack's call times out.
    monkeypatch.setattr(consumer_state, "VERDICT_FLUSH_SECONDS", 0.5)
    queue = get_queue()
    load_scripts(queue)
    ok, refused = queue.send_many(["ok", "refuse"])
    together = threading.Barrier(2)

    def handler(message: Message) -> bool:
        together.wait(timeout=5)  # both verdicts reach the consumer at once
        return bool(message.payload == "ok")

    def stall_after_the_ack(**kwargs: Any) -> None:
        stall(stalling_redis, how)

    signals.message_acked.connect(stall_after_the_ack)
    worker = Worker([(queue, handler)], concurrency=2, burst=True)
    try:
        with Signalled() as signalled, caplog.at_level(logging.WARNING):
            run_to_the_end(worker)  # before the fix: the count stayed at 1 in flight, forever
    finally:
        signals.message_acked.disconnect(stall_after_the_ack)

    assert "cannot reach Redis at" in caplog.text  # the nack did fail at first
    assert "delivered again" not in caplog.text
    assert signalled.ids == {"acked": [ok], "nacked": [refused], "exhausted": [refused]}
    assert (worker.handled, worker.failed) == (2, 1)
    stats = queue.stats()
    assert (stats["unack"], stats["garbage"], stats["unannounced"]) == (0, 1, 0)
    assert (stats["acked_total"], stats["failed_total"]) == (1, 1)


def test_an_ack_whose_reply_was_lost_is_repeated_and_signalled_once(
    stalling_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    queue = get_queue()
    load_scripts(queue)
    message_id = queue.send("ok")

    def handler(message: Message) -> None:
        stall(stalling_redis, "sleep")  # the ack goes out while Redis sleeps, and runs later

    worker = Worker([(queue, handler)], burst=True)
    with Signalled() as signalled, caplog.at_level(logging.WARNING):
        run_to_the_end(worker)

    assert "cannot reach Redis at" in caplog.text  # the ack's reply was lost
    assert "delivered again" not in caplog.text  # before the fix: said, and untrue
    assert signalled.ids["acked"] == [message_id]
    assert worker.handled == 1
    stats = queue.stats()
    assert (stats["unack"], stats["acked_total"]) == (0, 1)


def test_a_hand_back_that_fails_is_released_once_redis_answers(
    stalling_redis: RedisServer,
) -> None:
    queue = get_queue()
    load_scripts(queue)
    queue.send_many(["a", "b"])
    worker = Worker([(queue, remember)])
    [consumer] = worker.consumers
    # What the consumer's loop does when it fetches, and later hands the batch back unstarted
    # (stopping, or its buffer went stale) just as Redis stops answering.
    fetched = consumer.queue.fetch(2)
    with consumer._lock:
        consumer._in_flight += len(fetched.messages)
    stall(stalling_redis, "pause")
    with pytest.raises(RedisError):
        consumer._hand_back(fetched.messages)
    assert consumer.in_flight == 2  # still to be handed back: a stop waits for them

    time.sleep(STALL_SECONDS)
    consumer._flush()  # the loop's next turn, once Redis answers
    assert consumer.in_flight == 0
    stats = queue.stats()
    assert (stats["unack"], stats["ready"]) == (0, 2)  # not left to time out
    assert [m.attempt for m in queue.fetch(2).messages] == [1, 1]  # no attempt used


def test_a_failure_just_after_the_server_came_back_is_said_only_if_failures_go_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread retries on its own: a call that began before the server came back may
    fail just after another thread said it is back. That straggler is not a new outage;
    failures that go on past SETTLE_SECONDS are."""
    from delayqueue_django.worker import outages as outages_module

    outages = outages_module.Outages()
    refused = redis.ConnectionError("Error 111 connecting to 10.0.0.9:6379. Connection refused.")
    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        outages.failed("10.0.0.9:6379", refused)
        outages.reached("10.0.0.9:6379")
        outages.failed("10.0.0.9:6379", refused)  # a straggler
        outages.reached("10.0.0.9:6379")  # nothing was said of it: nothing to end
        outages.failed("10.0.0.9:6379", refused)
        monkeypatch.setattr(outages_module, "SETTLE_SECONDS", 0.0)
        outages.failed("10.0.0.9:6379", refused)  # still failing once settled: an outage
        outages.reached("10.0.0.9:6379")
    said = [re.sub(r"after \d+\.\d s$", "after …", r.getMessage()) for r in caplog.records]
    assert said == [
        "cannot reach Redis at 10.0.0.9:6379, retrying: Error 111 connecting to 10.0.0.9:6379. "
        "Connection refused.",
        "connected to Redis at 10.0.0.9:6379 again, after …",
        "cannot reach Redis at 10.0.0.9:6379, retrying: Error 111 connecting to 10.0.0.9:6379. "
        "Connection refused.",
        "connected to Redis at 10.0.0.9:6379 again, after …",
    ]


def test_an_outage_is_said_once_reminded_and_its_end_said(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayqueue_django.worker import outages as outages_module

    outages = outages_module.Outages()
    refused = redis.ConnectionError("Error 111 connecting to 10.0.0.9:6379. Connection refused.")
    wrapped = QueueUnavailable("queue 'default' cannot reach Redis at 10.0.0.9:6379: …")
    wrapped.__cause__ = refused
    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        outages.reached("10.0.0.9:6379")  # up all along: nothing to say
        for error in (refused, wrapped, refused):  # many threads, many tries: said once
            outages.failed("10.0.0.9:6379", error)
        monkeypatch.setattr(outages_module, "REMIND_SECONDS", 0.0)
        outages.failed("10.0.0.9:6379", wrapped)
        outages.reached("10.0.0.9:6379")
        outages.reached("10.0.0.9:6379")
    said = [re.sub(r"\d+\.\d s$|after \d+ s", "…", r.getMessage()) for r in caplog.records]
    assert said == [
        "cannot reach Redis at 10.0.0.9:6379, retrying: Error 111 connecting to 10.0.0.9:6379. "
        "Connection refused.",
        "still cannot reach Redis at 10.0.0.9:6379 …, retrying: Error 111 connecting to "
        "10.0.0.9:6379. Connection refused.",
        "connected to Redis at 10.0.0.9:6379 again, after …",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
