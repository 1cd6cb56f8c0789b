"""Time comes from the store's clock: for Redis, the server's, so clients whose clocks are an
hour off still deliver on time."""

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import RedisStore
from delayqueue_django.engine.sharding.store import parts
from tests.helpers import fetch_when_due, store_time_ms, wait_for
from tests.redis_servers import RedisServer


@pytest.mark.parametrize("skew", [timedelta(hours=1), timedelta(hours=-1)])
def test_delays_are_counted_on_the_redis_clock_whatever_the_client_clock_says(
    redis_queue: Queue, skew: timedelta
) -> None:
    # About Redis: a memory store's clock is this process's own.
    queue = redis_queue
    with time_machine.travel(datetime.now(UTC) + skew, tick=True):
        assert abs(time.time() * 1000 - store_time_ms(queue)) > 3_500_000  # really skewed
        before = store_time_ms(queue)
        message_id = queue.send("on time", delay=0.3)
        [entry] = queue.list_messages("pending")
        assert entry.score_ms is not None
        assert 300 <= entry.score_ms - before < 1300

        assert queue.fetch().messages == []  # a skewed consumer does not take it early
        started = time.perf_counter()
        [message] = wait_for(lambda: queue.fetch().messages, timeout=5, what="delivery")
        waited = time.perf_counter() - started
    assert message.id == message_id
    assert waited < 5  # on time by the real clock, not an hour early or late


def test_absolute_due_time_is_kept_to_the_millisecond(queue: Queue) -> None:
    at = datetime(2031, 5, 17, 8, 30, 15, 250_000, tzinfo=UTC)
    queue.send("at", at=at)
    [entry] = queue.list_messages("pending")
    assert entry.score_ms == int(at.timestamp() * 1000)


def test_an_absolute_time_in_the_past_is_due_now(queue: Queue) -> None:
    before = store_time_ms(queue)
    message_id = queue.send("overdue", at=datetime(2001, 1, 1, tzinfo=UTC))
    after = store_time_ms(queue)
    # Due at the store's now, not in 2001: stats would report a lag of 25 years and the
    # workers a delivery that late.
    [entry] = queue.list_messages("pending")
    assert entry.score_ms is not None
    assert before <= entry.score_ms <= after
    assert queue.stats()["lag_ms"] <= store_time_ms(queue) - before
    [message] = queue.fetch().messages
    assert (message.id, message.due_ms) == (message_id, entry.score_ms)


def test_an_absolute_time_is_rounded_up_to_the_millisecond(queue: Queue) -> None:
    # Rounded to the nearest ms, 250.4 ms past the second would be handed out 0.4 ms early.
    queue.send("at", at=datetime(2031, 5, 17, 8, 30, 15, 250_400, tzinfo=UTC))
    queue.send("at", at=datetime(2031, 5, 17, 8, 30, 15, 250_999, tzinfo=UTC))
    entries = queue.list_messages("pending")
    whole_second_ms = int(datetime(2031, 5, 17, 8, 30, 15, tzinfo=UTC).timestamp()) * 1000
    assert [entry.score_ms for entry in entries] == [whole_second_ms + 251] * 2


def test_a_delay_is_rounded_up_to_the_millisecond_from_the_redis_clock_in_us(
    redis_queue: Queue, raw: Any
) -> None:
    # Rounded to the nearest ms and added to the clock truncated to the ms, a 0.4 ms delay
    # was due up to 1.4 ms early.
    for delay in (0.0004, 0.0015, 1.0005):
        seconds, micros = raw.time()
        before_us = seconds * 1_000_000 + micros
        message_id = redis_queue.send("soon", delay=delay)
        seconds, micros = raw.time()
        after_us = seconds * 1_000_000 + micros
        stored = redis_queue.peek(message_id)
        assert stored is not None
        assert stored.score_ms is not None
        assert before_us + delay * 1_000_000 <= stored.score_ms * 1000
        assert stored.score_ms * 1000 < after_us + delay * 1_000_000 + 1000


def test_a_fetch_reads_the_redis_clock_to_the_microsecond(redis_queue: Queue, raw: Any) -> None:
    # Workers time their wake-ups with it; a clock read to the millisecond would make them
    # up to a millisecond late.
    for _ in range(5):
        seconds, micros = raw.time()
        before_us = seconds * 1_000_000 + micros
        fetched = redis_queue.fetch()
        seconds, micros = raw.time()
        after_us = seconds * 1_000_000 + micros
        assert 0 <= fetched.now_us <= 999
        assert before_us <= fetched.now_ms * 1000 + fetched.now_us <= after_us


# A trickle of messages with random delays, sub-millisecond fractions included, against a
# consumer fetching in a tight loop: the strictest test of "never early" a single machine
# allows (a worker adds its own hand-off on top). Kept to about a second of sending.
TRICKLED = 1500


@pytest.fixture(params=["standalone", "memory"])
def trickle_queue(
    request: pytest.FixtureRequest, settings: Any, redis_server: RedisServer
) -> Queue:
    url = "memory://" if request.param == "memory" else redis_server.url
    settings.DELAYQUEUES = {"default": {"URL": url}}
    return get_queue()


def _store_clock_us(queue: Queue) -> Callable[[], int]:
    """The queue's clock in µs: Redis's TIME, or this machine's for the memory store."""
    store = parts(queue.store)["0"]
    if isinstance(store, RedisStore):
        client = store.client

        def redis_time_us() -> int:
            seconds, micros = client.time()
            return int(seconds) * 1_000_000 + int(micros)

        return redis_time_us
    return lambda: time.time_ns() // 1000


def test_no_message_is_handed_out_before_its_due_time(trickle_queue: Queue) -> None:
    queue, store_clock_us = trickle_queue, _store_clock_us(trickle_queue)
    shuffle = random.Random(19)
    # Per message index, read before the send call: the earliest it may be handed out, on
    # the store's clock (µs) and on this machine's (s). A message is due `delay` after Redis
    # runs its send, which is later still.
    earliest_store_us: dict[int, float] = {}
    earliest_local: dict[int, float] = {}

    def produce() -> None:
        for index in range(TRICKLED):
            delay = shuffle.choice([0, shuffle.uniform(0, 0.002), shuffle.uniform(0, 0.02)])
            local, store_us = time.time(), store_clock_us()
            if index % 2:
                at = datetime.fromtimestamp(local + delay, tz=UTC)
                earliest_store_us[index] = earliest_local[index] = at.timestamp()
                earliest_store_us[index] *= 1_000_000
                queue.send(index, at=at)
            else:
                earliest_store_us[index] = store_us + delay * 1_000_000
                earliest_local[index] = local + delay
                queue.send(index, delay=delay)

    producer = threading.Thread(target=produce)
    producer.start()
    handed_store_us: dict[int, int] = {}
    handed_local: dict[int, float] = {}
    give_up = time.monotonic() + 30
    while len(handed_local) < TRICKLED and time.monotonic() < give_up:
        fetched = queue.fetch(100)
        received = time.time()  # the earliest a handler could start
        for message in fetched.messages:
            # The store's clock when the fetch ran, i.e. when it handed the message out.
            handed_store_us[message.payload] = fetched.now_ms * 1000 + fetched.now_us
            handed_local[message.payload] = received
        queue.ack(fetched.messages)
    producer.join()

    assert len(handed_local) == TRICKLED
    early_by_store = {
        index: earliest_store_us[index] - handed
        for index, handed in handed_store_us.items()
        if handed < earliest_store_us[index]
    }
    early_by_local = {
        index: earliest_local[index] - handed
        for index, handed in handed_local.items()
        if handed < earliest_local[index]
    }
    # How early each was, in µs on the store's clock and in seconds on this machine's.
    assert (early_by_store, early_by_local) == ({}, {})


def test_a_retry_is_due_its_delay_after_the_nack_rounded_up(queue: Queue) -> None:
    # The nack's clock truncated to the ms plus the delay was up to 1 ms before the delay
    # had passed.
    store_clock_us = _store_clock_us(queue)
    queue.send("refused")
    for _ in range(3):  # the default budget: 3 retries
        [message] = fetch_when_due(queue)
        before_us = store_clock_us()
        [outcome] = queue.nack([message], delay=0.05)
        after_us = store_clock_us()
        assert before_us + 50_000 <= outcome.at_ms * 1000 < after_us + 50_000 + 1000


def test_a_configured_retry_delay_is_rounded_up_too(configure: Callable[..., Queue]) -> None:
    # Rounded to the nearest ms, a 0.4 ms NACK_REDELIVERY_DELAY made the retry due at once.
    assert configure(NACK_REDELIVERY_DELAY=[0.007, 2.007]).config.nack_delays_ms == (7, 2007)
    queue = configure(NACK_REDELIVERY_DELAY=0.0004)
    assert queue.config.nack_delays_ms == (1,)
    store_clock_us = _store_clock_us(queue)
    queue.send("refused")
    [message] = fetch_when_due(queue)
    before_us = store_clock_us()
    [outcome] = queue.nack([message])
    assert before_us + 400 <= outcome.at_ms * 1000
