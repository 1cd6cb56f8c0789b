"""TIME_LIMIT with handler threads: ``message.time_left()``, the soft check
``message.check_time_limit()``, and an overrun logged and counted. (The hard stop of a
worker process is in test_worker_supervisor.)"""

import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from delayqueue_django import Message, get_queue, signals
from delayqueue_django.core.handlers import resolve
from delayqueue_django.exceptions import TimeLimitExceeded
from delayqueue_django.worker import Worker
from tests.redis_servers import RedisServer

SEEN: list[dict[str, Any]] = []


def checking_handler(message: Message) -> None:
    """Sleeps ``seconds``, noting the time left before and after; ``check`` calls the soft
    check at the end."""
    before = message.time_left()
    time.sleep(message.payload["seconds"])
    SEEN.append({"id": message.id, "before": before, "after": message.time_left()})
    if message.payload.get("check"):
        message.check_time_limit()


@pytest.fixture(autouse=True)
def _forget_seen() -> None:
    SEEN.clear()


def configure(settings: Any, url: str, **options: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": url,
            "HANDLER": "tests.test_time_limits.checking_handler",
            "NACK_REDELIVERY_DELAY": 0,
            "MAX_CONSUME_DURATION": 10,
            **options,
        }
    }


def test_a_handler_is_told_its_time_and_the_check_raises_once_past_it(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url, TIME_LIMIT=0.3, RETRY_COUNT=0)
    queue = get_queue()
    in_time = queue.send({"seconds": 0.05, "check": True})
    late = queue.send({"seconds": 0.4, "check": True})
    refused: list[Any] = []

    def on_nacked(*, message: Message, error: Any, **kwargs: Any) -> None:
        refused.append((message.id, error))

    signals.message_nacked.connect(on_nacked)
    out = StringIO()
    try:
        call_command("run_delayqueue", burst=True, concurrency=2, stdout=out)
    finally:
        signals.message_nacked.disconnect(on_nacked)

    seen = {entry["id"]: entry for entry in SEEN}
    assert 0.25 < seen[in_time]["before"] <= 0.3
    assert 0 < seen[in_time]["after"] < 0.3
    assert seen[late]["after"] == 0
    [(refused_id, error)] = refused
    assert refused_id == late
    assert isinstance(error, TimeLimitExceeded)
    # Logged as past the limit, with the run's length.
    assert "past TIME_LIMIT (0.3 s): message id=" in out.getvalue()


def test_an_overrun_is_counted_in_the_heartbeat_details(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url, TIME_LIMIT=0.1)
    queue = get_queue()
    queue.send({"seconds": 0.2})  # no check: it runs on past the limit, and is acked
    worker = Worker([(queue, resolve(queue.config))], burst=True, concurrency=2)
    worker.run()
    assert (worker.handled, worker.failed) == (1, 0)
    assert worker.details()["time_limit_overruns"] == 1


def test_without_a_time_limit_there_is_no_time_left_to_tell(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url)
    get_queue().send({"seconds": 0, "check": True})
    call_command("run_delayqueue", burst=True, stdout=StringIO())
    [seen] = SEEN
    assert seen["before"] is None
    assert seen["after"] is None
