"""Time comes from the store's clock: for Redis, the server's, so clients whose clocks are an
hour off still deliver on time."""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from delayqueue_django.queue import Queue
from tests.helpers import store_time_ms, wait_for


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
    message_id = queue.send("overdue", at=datetime(2001, 1, 1, tzinfo=UTC))
    [message] = queue.fetch().messages
    assert message.id == message_id


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
