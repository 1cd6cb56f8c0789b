"""The worker's wake-ups and fetches when connections misbehave: a stray publication on the
wake-up channel, errors in the subscription that are not Redis's, a listener that ends, a
fetch that fails, and connections dropped silently (a TCP relay that stops forwarding)."""

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue_django import get_queue
from delayqueue_django.core import stores
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import WakeupSubscription
from delayqueue_django.engine.pubsub import PROBE_AFTER_SECONDS, PROBE_REPLY_SECONDS
from delayqueue_django.worker import Worker
from tests.helpers import redis_store, wait_for
from tests.redis_servers import RedisServer
from tests.tcp_relay import TcpRelay

pytestmark = pytest.mark.timeout(60)

# Far below the 30 s recheck (which these tests move an hour away), yet generous for a
# loaded machine: what a silent drop may cost is a socket timeout (5 s) or a probe of the
# subscription (PROBE_AFTER_SECONDS + PROBE_REPLY_SECONDS), and a reconnection.
SILENT_DROP_BOUND_SECONDS = 15.0
# A wake-up heard: the message starts within this of its due time.
ON_TIME_SECONDS = 3.0


@pytest.fixture(autouse=True)
def _no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost wake-up must fail a test, not hide behind the periodic recheck."""
    from delayqueue_django.worker import consumer

    monkeypatch.setattr(consumer, "IDLE_RECHECK_SECONDS", 3600.0)


class Handled:
    """A handler recording, in this process, when each payload started."""

    def __init__(self) -> None:
        self.started: dict[Any, float] = {}

    def __call__(self, message: Message) -> None:
        self.started.setdefault(message.payload, time.monotonic())

    def within(self, payload: Any, seconds: float) -> float:
        """How long after now ``payload`` started (waiting up to ``seconds`` for it)."""
        since = time.monotonic()
        wait_for(lambda: payload in self.started, timeout=seconds, what=f"{payload!r} handled")
        return self.started[payload] - since


@pytest.fixture
def handled() -> Handled:
    return Handled()


@pytest.fixture
def start_worker(handled: Handled) -> Iterator[Callable[..., Worker]]:
    started: list[tuple[Worker, threading.Thread]] = []

    def start(queue: Queue, heartbeat_interval: float = 1.0) -> Worker:
        worker = Worker([(queue, handled)], heartbeat_interval=heartbeat_interval)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        wait_for(
            lambda: all(c.listener.subscribed.is_set() for c in worker.consumers),
            what="the wake-up subscription",
        )
        return worker

    yield start
    for worker, thread in started:
        worker.request_stop()
        thread.join(timeout=15)
        assert not thread.is_alive()


@pytest.fixture(params=["redis", "memory"])
def any_queue(request: pytest.FixtureRequest, redis_server: RedisServer, settings: Any) -> Queue:
    url = redis_server.url if request.param == "redis" else "memory://"
    settings.DELAYQUEUES = {"default": {"URL": url}}
    return get_queue()


# A stray publication (item: one non-integer message killed the listener for good)


def test_a_stray_publication_on_the_wakeup_channel_is_ignored_and_logged(
    redis_queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    raw = redis_store(redis_queue).client
    subscription = redis_queue.store.subscribe_wakeups()
    try:
        with caplog.at_level(logging.WARNING, logger="delayqueue_django.engine"):
            raw.publish(redis_queue.store.keys.wakeup_channel, "hello")
            assert subscription.wait(timeout=0.3) is None
        assert (
            "ignored a message on wake-up channel {delayqueue:default}:wakeup that is not a "
            "due time: b'hello'" in caplog.text
        )
        redis_queue.send("x")
        assert subscription.wait(timeout=1.0) is not None  # real wake-ups still come
    finally:
        subscription.close()


def test_a_worker_still_wakes_after_a_stray_publication(
    redis_server: RedisServer, start_worker: Callable[..., Worker], handled: Handled
) -> None:
    queue = get_queue()
    start_worker(queue)
    redis_server.client().publish(queue.store.keys.wakeup_channel, "hello")
    time.sleep(0.2)
    queue.send("after the stray publication")
    assert handled.within("after the stray publication", ON_TIME_SECONDS) < ON_TIME_SECONDS


# Errors in the subscription that are not Redis's, and a listener that ends


class FailingOnce:
    """Wraps the store's subscriptions: the first wait of the first one raises ``error``."""

    def __init__(self, store: Any, error: BaseException) -> None:
        self.store = store
        self.error: BaseException | None = error
        self.subscribed = 0

    def __call__(self) -> WakeupSubscription:
        self.subscribed += 1
        subscription = type(self.store).subscribe_wakeups(self.store)
        outer = self

        class Subscription:
            def wait(self, timeout: float) -> int | None:
                if outer.error is not None:
                    error, outer.error = outer.error, None
                    raise error
                due: int | None = subscription.wait(timeout)
                return due

            def close(self) -> None:
                subscription.close()

        return Subscription()


def test_an_error_in_the_subscription_that_is_not_redis_s_is_logged_and_it_subscribes_again(
    any_queue: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As redis-py's cluster pub/sub can raise in a failover.
    failing = FailingOnce(any_queue.store, KeyError("a node vanished"))
    monkeypatch.setattr(any_queue.store, "subscribe_wakeups", failing)
    with caplog.at_level(logging.ERROR, logger="delayqueue_django.worker"):
        start_worker(any_queue)
        wait_for(lambda: failing.subscribed == 2, what="a second subscription")
    assert "unexpected error in the wake-up subscription queue=default" in caplog.text
    assert "KeyError: 'a node vanished'" in caplog.text
    time.sleep(0.2)
    any_queue.send("later", delay=0.3)
    assert handled.within("later", ON_TIME_SECONDS) < ON_TIME_SECONDS


# The listener thread ending is the point; pytest would report it as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_listener_thread_that_ends_is_replaced(
    any_queue: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # SystemExit gets past any `except Exception`: the thread ends, silently.
    failing = FailingOnce(any_queue.store, SystemExit())
    monkeypatch.setattr(any_queue.store, "subscribe_wakeups", failing)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        worker = start_worker(any_queue)
        any_queue.send("soon", delay=0.5)
        assert handled.within("soon", ON_TIME_SECONDS) < ON_TIME_SECONDS
    assert "wake-up listener stopped queue=default; starting a new one" in caplog.text
    [consumer] = worker.consumers
    wait_for(lambda: consumer.listener.subscribed.is_set(), what="the new listener")
    any_queue.send("woken by the new listener")
    assert handled.within("woken by the new listener", ON_TIME_SECONDS) < ON_TIME_SECONDS


def test_while_wakeups_cannot_be_heard_the_consumer_looks_every_second(
    any_queue: Queue,
    handled: Handled,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused() -> WakeupSubscription:
        raise RedisConnectionError("SUBSCRIBE refused (as by an ACL without channels)")

    monkeypatch.setattr(any_queue.store, "subscribe_wakeups", refused)
    worker = Worker([(any_queue, handled)])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        time.sleep(2.5)  # the consumer gave up waiting for the subscription (2 s)
        for n in range(3):
            any_queue.send(n)
            assert handled.within(n, ON_TIME_SECONDS) < ON_TIME_SECONDS
    finally:
        worker.request_stop()
        thread.join(timeout=15)


def test_a_lost_subscription_has_the_consumer_look_every_second_from_then_on(
    any_queue: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost = threading.Event()
    subscribe = type(any_queue.store).subscribe_wakeups

    class Losable:
        def __init__(self, subscription: WakeupSubscription) -> None:
            self.subscription = subscription

        def wait(self, timeout: float) -> int | None:
            if lost.is_set():
                raise RedisConnectionError("Connection closed by server (on purpose)")
            due: int | None = self.subscription.wait(timeout)
            return due

        def close(self) -> None:
            self.subscription.close()

    def subscribe_unless_lost() -> WakeupSubscription:
        if lost.is_set():
            raise RedisConnectionError("SUBSCRIBE refused (on purpose)")
        return Losable(subscribe(any_queue.store))

    monkeypatch.setattr(any_queue.store, "subscribe_wakeups", subscribe_unless_lost)
    # Idle: nothing planned for an hour, the next heartbeat a minute away.
    [consumer] = start_worker(any_queue, heartbeat_interval=60).consumers
    time.sleep(0.3)
    lost.set()
    wait_for(lambda: not consumer.listener.subscribed.is_set(), what="the subscription lost")
    any_queue.send("while no wake-up can be heard")
    assert handled.within("while no wake-up can be heard", ON_TIME_SECONDS) < ON_TIME_SECONDS


# A failed fetch


def test_a_fetch_that_failed_after_a_wakeup_is_repeated_after_the_backoff(
    any_queue: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures: list[int] = []
    real_fetch = Queue.fetch

    def fetch_failing_once(self: Queue, count: int | None = None, **kw: Any) -> Any:
        if armed.is_set() and not failures:
            failures.append(1)
            raise RedisConnectionError("Connection reset by peer (on purpose)")
        return real_fetch(self, count, **kw)

    armed = threading.Event()
    monkeypatch.setattr(Queue, "fetch", fetch_failing_once)
    start_worker(any_queue)
    time.sleep(0.3)  # idle, with nothing planned for an hour
    armed.set()
    any_queue.send("woke a fetch that failed")
    assert handled.within("woke a fetch that failed", ON_TIME_SECONDS) < ON_TIME_SECONDS
    assert failures == [1]


# Connections dropped silently


@pytest.fixture
def relay(redis_server: RedisServer, settings: Any) -> Iterator[TcpRelay]:
    """The default queue reached through a relay to the private Redis, with the package's
    connection defaults (no OPTIONS)."""
    relay = TcpRelay(redis_server.port)
    settings.DELAYQUEUES = {"default": {"URL": relay.url}}
    yield relay
    relay.close()


@pytest.fixture
def direct(redis_server: RedisServer, relay: TcpRelay) -> Queue:
    """The same queue, reached directly: the test's own sends, never dropped."""
    config = dataclasses.replace(get_queue().config, url=redis_server.url)
    return Queue(config, stores.store_for(config))


def test_a_dead_subscription_is_found_by_its_probe_and_the_idle_connections_renewed(
    relay: TcpRelay,
) -> None:
    queue = get_queue()
    client = redis_store(queue).client
    subscription = queue.store.subscribe_wakeups()
    try:
        client.ping()  # a second connection, idle in the pool from now on
        assert relay.freeze() == 2
        started = time.monotonic()

        def wait_until_it_raises() -> None:
            while True:
                subscription.wait(timeout=1.0)

        with pytest.raises(RedisConnectionError, match="no reply to a PING on the wake-up"):
            wait_until_it_raises()
        found_after = time.monotonic() - started
        assert found_after <= PROBE_AFTER_SECONDS + PROBE_REPLY_SECONDS + 2
        # The pooled connection went with it: renewed, not found dead by a socket timeout.
        started = time.monotonic()
        assert client.ping()
        assert time.monotonic() - started < 1.0
    finally:
        subscription.close()


def test_wakeups_come_back_within_seconds_after_a_silent_drop(
    relay: TcpRelay,
    direct: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
) -> None:
    start_worker(get_queue())
    direct.send("before the drop")
    assert handled.within("before the drop", ON_TIME_SECONDS) < ON_TIME_SECONDS

    assert relay.freeze() >= 2  # the subscription and the pooled connection at least
    direct.send("right after the drop")
    assert handled.within("right after the drop", SILENT_DROP_BOUND_SECONDS) < (
        SILENT_DROP_BOUND_SECONDS
    )
    # Subscribed again, on a new connection: wake-ups are heard at once again.
    direct.send("once recovered", delay=1)
    assert handled.within("once recovered", 1 + ON_TIME_SECONDS) < 1 + ON_TIME_SECONDS


def test_a_fetch_over_a_silently_dropped_connection_times_out_and_is_repeated(
    relay: TcpRelay,
    direct: Queue,
    start_worker: Callable[..., Worker],
    handled: Handled,
) -> None:
    start_worker(get_queue())
    direct.send("due in a second", delay=1)
    time.sleep(0.3)  # the worker plans its next fetch for then, over its pooled connection
    relay.freeze()
    assert handled.within("due in a second", SILENT_DROP_BOUND_SECONDS) < (
        SILENT_DROP_BOUND_SECONDS
    )
    direct.send("once recovered")
    assert handled.within("once recovered", ON_TIME_SECONDS) < ON_TIME_SECONDS
