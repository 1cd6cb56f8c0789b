"""The worker in-process: ``call_command("run_delayqueue", burst=True)`` and a Worker thread,
on Redis and (``worker_queue``) on the memory store, whose worker runs in the sending process."""

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from benchmarks.probes import Monitored
from delayqueue_django import Message, get_queue, signals
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.timings import histogram_from_totals
from delayqueue_django.worker import Worker, heartbeat
from tests.helpers import wait_for
from tests.redis_servers import RedisServer
from tests.worker_handlers import MEMORY_LOG, UNBLOCK, handle, read_log

# A lost wake-up must fail a test, not hide behind the periodic recheck: with the recheck an
# hour away, any lost wake-up runs into the timeout.
pytestmark = pytest.mark.timeout(20)


@pytest.fixture(autouse=True)
def _no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    from delayqueue_django.worker import consumer

    monkeypatch.setattr(consumer, "IDLE_RECHECK_SECONDS", 3600.0)


@pytest.fixture(autouse=True)
def _empty_memory_log() -> None:
    MEMORY_LOG.clear()


@pytest.fixture(params=["redis", "memory"])
def worker_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """The queues' URL: the private Redis, or the memory store (the worker then runs in the
    process that sends, as it must)."""
    return redis_server.url if request.param == "redis" else "memory://"


def _worker_configurer(url: str, settings: Any) -> Callable[..., Queue]:
    def configure(**options: Any) -> Queue:
        settings.DELAYQUEUES = {
            "default": {
                "URL": url,
                "HANDLER": "tests.worker_handlers.handle",
                "NACK_REDELIVERY_DELAY": 0,
                **options,
            }
        }
        return get_queue()

    return configure


@pytest.fixture
def worker_queue(worker_url: str, settings: Any) -> Callable[..., Queue]:
    """``worker_queue(**options)``: the default queue, with the test handler, on each store."""
    return _worker_configurer(worker_url, settings)


@pytest.fixture
def redis_worker_queue(redis_server: RedisServer, settings: Any) -> Callable[..., Queue]:
    """``worker_queue`` on Redis only: for tests that do not depend on the store, or are
    about Redis."""
    return _worker_configurer(redis_server.url, settings)


def run_burst(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("run_delayqueue", *args, burst=True, stdout=out, **options)
    return out.getvalue()


def events(kind: str) -> list[dict[str, Any]]:
    return [entry for entry in read_log() if entry["event"] == kind]


def test_burst_handles_everything_due_and_exits(worker_queue: Callable[..., Queue]) -> None:
    queue = worker_queue()
    ids = queue.send_many([{"n": n} for n in range(25)])
    later = queue.send({"n": "later"}, delay=60)

    out = run_burst(verbosity=1)

    assert heartbeat.live_workers(queue) == []  # a finished worker removes its heartbeat
    assert sorted(e["id"] for e in events("done")) == sorted(ids)
    assert later not in {e["id"] for e in events("start")}
    stats = queue.stats()
    assert (stats["pending"], stats["unack"], stats["garbage"]) == (1, 0, 0)
    assert "stopped: 25 handled, 0 failed." in out


def test_acked_signal_fires_after_the_ack_is_committed(worker_queue: Callable[..., Queue]) -> None:
    queue = worker_queue()
    message_id = queue.send({"do": "ok"})
    run_burst()
    [acked] = events("acked")
    assert acked["id"] == message_id
    assert acked["still_in_redis"] is False


def test_signals_are_sent_by_the_queue_class(worker_queue: Callable[..., Queue]) -> None:
    queue = worker_queue()
    queue.send_many([{"do": "ok"}, {"do": "reject"}])
    senders: list[Any] = []

    def remember(sender: Any, **kwargs: Any) -> None:
        senders.append(sender)

    for signal in (signals.message_acked, signals.message_nacked, signals.message_exhausted):
        signal.connect(remember)
    try:
        run_burst()
    finally:
        for signal in (signals.message_acked, signals.message_nacked, signals.message_exhausted):
            signal.disconnect(remember)
    assert len(senders) == 3  # acked; nacked and exhausted for the rejected one
    assert set(senders) == {Queue}


@pytest.mark.parametrize("action", ["false", "raise"])
def test_refused_messages_are_retried_then_exhausted_with_signals(
    worker_queue: Callable[..., Queue], action: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = worker_queue(RETRY_COUNT=2)
    message_id = queue.send({"do": action})

    with caplog.at_level(logging.ERROR, logger="delayqueue_django"):
        run_burst()

    assert [e["attempt"] for e in events("start")] == [1, 2, 3]
    nacked = events("nacked")
    assert len(nacked) == 3
    assert nacked[-1]["retry_at_ms"] is None
    assert all(n["retry_at_ms"] is not None for n in nacked[:2])
    [exhausted] = events("exhausted")
    assert exhausted == {**exhausted, "id": message_id, "payload": {"do": action}, "attempt": 3}
    assert [m.id for m in queue.list_messages("garbage")] == [message_id]
    assert queue.stats()["unannounced"] == 0
    if action == "raise":
        assert "handler failed message id=" in caplog.text
        assert "RuntimeError: handler failed on purpose" in caplog.text
        assert "RuntimeError('handler failed on purpose')" in nacked[0]["error"]
    else:
        assert nacked[0]["error"] == "None"


def test_reject_buries_at_once(worker_queue: Callable[..., Queue]) -> None:
    queue = worker_queue(RETRY_COUNT=5)
    message_id = queue.send({"do": "reject"})
    run_burst()
    assert len(events("start")) == 1
    assert [e["id"] for e in events("exhausted")] == [message_id]


@pytest.mark.parametrize(
    "error", [ValueError("receiver bug"), SystemExit(3), KeyboardInterrupt()], ids=repr
)
def test_a_receiver_that_raises_is_logged_and_the_worker_carries_on(
    worker_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    queue = worker_queue()
    called_after: list[str] = []

    def broken(**kwargs: Any) -> None:
        raise error

    async def broken_async(**kwargs: Any) -> None:
        raise error

    def after(*, message: Any, **kwargs: Any) -> None:
        called_after.append(message.id)

    for receiver in (broken, broken_async, after):
        signals.message_acked.connect(receiver)
    try:
        ids = queue.send_many([{"n": 1}, {"n": 2}])
        with caplog.at_level(logging.ERROR, logger="delayqueue_django"):
            out = run_burst()
    finally:
        for receiver in (broken, broken_async, after):
            signals.message_acked.disconnect(receiver)
    assert len(events("done")) == 2
    assert sorted(called_after) == sorted(ids)  # the receivers after a broken one still run
    assert queue.stats()["unack"] == 0
    assert "stopped: 2 handled, 0 failed." in out
    failures = [r for r in caplog.records if r.getMessage().startswith("signal receiver")]
    assert len(failures) == 4  # each broken receiver, for each message
    assert f"{type(error).__name__}" in caplog.text


def test_database_connections_are_handled_as_for_a_request(
    worker_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayqueue_django.worker import handling

    calls: list[str] = []
    monkeypatch.setattr(handling, "close_old_connections", lambda: calls.append("close"))
    worker_queue().send({"do": "ok"})
    run_burst()
    assert calls == ["close", "close"]


def test_messages_handled_back_to_back_share_the_connection_check_between_them(
    redis_worker_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayqueue_django.worker import handling

    calls: list[str] = []
    monkeypatch.setattr(handling, "close_old_connections", lambda: calls.append("check"))
    queue = redis_worker_queue()
    queue.send_many([{"n": n} for n in range(30)])
    Worker([(queue, lambda message: calls.append("handle"))], burst=True).run()
    assert calls.count("handle") == 30
    # Every handler runs after a check (its own, or the one after the message before it)
    # and is followed by one; back to back, the check after one is the check before the next.
    assert calls[0] == calls[-1] == "check"
    assert "handle handle" not in " ".join(calls)
    assert calls.count("check") < 2 * 30


def test_verbosity_two_shows_each_message_and_the_banner(
    worker_queue: Callable[..., Queue], worker_url: str
) -> None:
    queue = worker_queue()
    message_id = queue.send({"n": 1})
    out = run_burst(verbosity=2)
    assert "delayqueue_django worker " in out
    assert "(burst), concurrency 1" in out
    if worker_url.startswith("memory://"):
        assert "queue 'default': memory:// (in this process), handler " in out
    else:
        assert "queue 'default': redis://127.0.0.1:" in out
    assert "handler tests.worker_handlers.handle, retries 3, max consume 30 s, batch 100" in out
    assert f"handled message id={message_id} queue=default attempt=1 verdict=ack" in out


def test_the_banner_shows_the_limits_set_a_run_time_rate_and_a_pause(
    worker_queue: Callable[..., Queue],
) -> None:
    queue = worker_queue()
    assert "\n    " not in run_burst(verbosity=1)  # none set: no line for them
    queue = worker_queue(RATE_LIMIT="2/s", MAX_IN_FLIGHT=5, TIME_LIMIT=2, EXPIRES=60)
    out = run_burst(verbosity=1)
    assert "\n    rate limit 2/s, max in flight 5, time limit 2 s, expires 60 s after due\n" in out
    assert "PAUSED" not in out
    # Before, a rate set at run time replaced the setting's unseen, and a pause went
    # unsaid until the first heartbeat's log line.
    queue.set_rate_limit("3/m")
    queue.pause()
    out = run_burst(verbosity=1)
    assert (
        "\n    rate limit 3/m (set at run time, in place of RATE_LIMIT 2/s), max in flight 5, "
        "time limit 2 s, expires 60 s after due\n"
    ) in out
    assert (
        "\n    PAUSED: no worker hands out its messages until it is resumed "
        "(manage.py delayqueue_pause default --resume, or the admin)\n"
    ) in out


def test_the_default_verbosity_summarizes_instead_of_a_line_per_message(
    worker_queue: Callable[..., Queue],
) -> None:
    queue = worker_queue()
    queue.send_many([{"n": 1}, {"do": "reject"}])
    out = run_burst()  # -v 1
    assert "handled message id=" not in out
    # The first verdicts after a quiet spell are told at once.
    assert "INFO delayqueue_django.worker: handled " in out
    assert out.rstrip().endswith("stopped: 2 handled, 1 failed.")


def test_a_summary_is_logged_at_most_every_summary_seconds(
    worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from delayqueue_django.worker import worker as worker_module

    monkeypatch.setattr(worker_module, "SUMMARY_SECONDS", 3600.0)
    queue = worker_queue()

    def summaries() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("handled ")]

    with caplog.at_level(logging.INFO, logger="delayqueue_django.worker"):
        worker = running_worker(queue)
        queue.send({"n": 1})
        wait_for(summaries, what="the first summary")
        queue.send_many([{"n": 2}, {"do": "reject"}])
        wait_for(lambda: worker.handled == 3, what="the other two handled")
        time.sleep(0.5)  # heartbeats come and go: nothing new within SUMMARY_SECONDS
        assert len(summaries()) == 1
        monkeypatch.setattr(worker_module, "SUMMARY_SECONDS", 0.0)
        wait_for(lambda: len(summaries()) == 2, what="the next heartbeat's summary")
    first, second = summaries()
    assert re.fullmatch(
        r"handled 1 message \(0 failed\) in the last \d+ s; 1 \(0 failed\) since start", first
    )
    assert re.fullmatch(
        r"handled 2 messages \(1 failed\) in the last \d+ s; 3 \(1 failed\) since start", second
    )


def test_verbosity_zero_is_quiet(worker_queue: Callable[..., Queue]) -> None:
    worker_queue().send({"n": 1})
    assert run_burst(verbosity=0) == ""


def test_credentials_never_appear_in_the_banner(settings: Any, redis_server: RedisServer) -> None:
    url = redis_server.url.replace("redis://", "redis://user:s3cret@")
    settings.DELAYQUEUES = {"default": {"URL": url, "HANDLER": "tests.worker_handlers.handle"}}
    from delayqueue_django.management.commands.run_delayqueue import describe_connection

    described = describe_connection(get_queue())
    assert "s3cret" not in described
    assert described.startswith("redis://127.0.0.1:")


def test_a_handler_registered_with_the_decorator(settings: Any, worker_url: str) -> None:
    settings.DELAYQUEUES = {"decorated": {"URL": worker_url}}
    message_id = get_queue("decorated").send("hi")
    run_burst("decorated")
    assert [e["id"] for e in read_log("decorated") if e["event"] == "decorated"] == [message_id]


def test_max_messages_stops_after_that_many(worker_queue: Callable[..., Queue]) -> None:
    queue = worker_queue()
    queue.send_many([{"n": n} for n in range(10)])
    call_command("run_delayqueue", max_messages=4, batch_size=2, stdout=StringIO())
    assert len(events("done")) == 4
    stats = queue.stats()
    assert stats["pending"] + stats["ready"] == 6
    assert stats["unack"] == 0


def test_max_messages_is_exact_over_several_queues_with_a_backlog_each(
    worker_url: str, settings: Any
) -> None:
    """Four consumers start fetching at the same moment: before, each counted on the whole
    of what was left, and most runs handled more than asked (up to 8 of 5)."""
    names = ("a", "b", "c", "d")
    settings.DELAYQUEUES = {
        name: {"URL": worker_url, "HANDLER": "tests.worker_handlers.handle"} for name in names
    }
    queues = [get_queue(name) for name in names]
    for queue in queues:
        queue.send_many([{"n": n} for n in range(10)])
    out = StringIO()
    call_command("run_delayqueue", max_messages=5, concurrency=2, stdout=out)
    assert len([e for e in read_log("a") if e["event"] == "done"]) == 5
    assert "stopped: 5 handled, 0 failed." in out.getvalue()
    left = [queue.stats() for queue in queues]
    assert sum(stats["pending"] + stats["ready"] for stats in left) == 40 - 5
    assert sum(stats["unack"] for stats in left) == 0


def test_a_share_of_max_messages_is_reserved_until_its_fetch_returns(
    redis_server: RedisServer, settings: Any
) -> None:
    """The accounting behind the exact count: a fetch's share stays reserved until it
    returns; one that failed keeps it, and its repeat asks the same (the repeat of a fetch
    whose reply was lost gets what that fetch took, whatever it asks)."""
    settings.DELAYQUEUES = {name: {"URL": redis_server.url} for name in ("a", "b")}
    worker = Worker([(get_queue(name), handle) for name in ("a", "b")], max_messages=3)
    a, b = worker.consumers
    assert worker.reserve(a, 2) == 2
    assert worker.reserve(b, 2) == 1  # what a's fetch under way leaves
    assert worker.reserve(a, 1) == 2  # a's fetch failed: its repeat, with its share
    worker.fetched(b)  # took nothing: its share is free again
    assert worker.reserve(b, 5) == 1
    unlimited = Worker([(get_queue("a"), handle)])
    assert unlimited.reserve(unlimited.consumers[0], 7) == 7


def test_a_share_of_max_messages_a_hand_back_frees_wakes_a_consumer_waiting_for_one(
    redis_server: RedisServer, settings: Any
) -> None:
    """Before, the consumer refused a share slept on until something else woke it (up to
    the idle recheck), though the hand-back's commit had set the share free."""
    settings.DELAYQUEUES = {name: {"URL": redis_server.url} for name in ("a", "b")}
    worker = Worker([(get_queue(name), handle) for name in ("a", "b")], max_messages=1)
    a, b = worker.consumers
    get_queue("a").send({"n": 1})
    assert worker.reserve(a, 1) == 1
    [message] = get_queue("a").fetch(1).messages
    with a._lock:  # what a fetch of the consumer's own counts
        a._in_flight += 1
    worker.fetched(a)
    assert worker.reserve(b, 1) == 0  # the one share is a's
    b.starved = True
    b._event.clear()
    a._hand_back([message])  # buffered, never started: released, committed
    assert b._event.is_set()
    assert worker.reserve(b, 1) == 1


def test_a_message_sent_at_a_past_time_is_neither_lag_nor_lateness(
    worker_queue: Callable[..., Queue],
) -> None:
    # Kept as the due time, two days ago read as two days of lag (failing any health probe)
    # and as a lateness sample of two days that never leaves the histogram.
    queue = worker_queue()
    queue.send({"do": "ok"}, at=timezone.now() - timedelta(days=2))
    assert queue.stats()["lag_ms"] < 60_000
    call_command("delayqueue_stats", max_lag=60, stdout=StringIO())  # no CommandError

    run_burst()
    assert len(events("done")) == 1
    lateness = histogram_from_totals(queue.store.totals(), "delivery_lateness")
    assert lateness.count == 1
    assert lateness.sum_seconds < 60


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["nope"], "no queue named 'nope' in DELAYQUEUES; configured: 'default'"),
        (["--concurrency", "0"], "must be 1 or more, not 0"),
        (["--max-messages", "-3"], "must be 1 or more, not -3"),
        (["--grace", "soon"], "'soon' is not a number of seconds"),
        (["--jitter", "-1"], "must be a finite number of seconds >= 0, not -1"),
        (["--batch-size", "x"], "'x' is not a whole number"),
        # 0 reads as "no heartbeats"; it was taken as one every 0.1 s.
        (["--heartbeat", "0"], "must be a finite number of seconds > 0, not 0"),
    ],
)
def test_bad_arguments_are_command_errors(
    redis_worker_queue: Callable[..., Queue], args: list[str], words: str
) -> None:
    redis_worker_queue()
    with pytest.raises(CommandError, match=re.escape(words)):
        call_command("run_delayqueue", *args, burst=True)


def test_a_queue_without_a_handler_is_a_command_error(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"mute": {"URL": redis_server.url}}
    with pytest.raises(CommandError) as raised:
        run_burst()
    # tests.worker_handlers decorates a function for the queue "decorated": named, as a
    # decorator naming the wrong queue is the likely mistake.
    assert str(raised.value) == (
        "queue 'mute' has no handler: set DELAYQUEUES['mute']['HANDLER'] or decorate a "
        "function with @delayqueue_django.handler('mute') (@handler registered functions "
        "for 'decorated')"
    )


def test_an_unimportable_handler_is_a_command_error(
    settings: Any, redis_server: RedisServer
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "HANDLER": "tests.nowhere.handle"}}
    with pytest.raises(CommandError) as raised:
        run_burst()
    assert str(raised.value) == (
        "DELAYQUEUES['default']['HANDLER'] is 'tests.nowhere.handle', but there is no module "
        "'tests.nowhere'.\nHINT: Check the spelling, or create tests/nowhere.py holding the "
        "handler: def handle(message): ..."
    )


def test_a_handler_module_raising_on_import_is_a_command_error(
    settings: Any, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "raising_handlers.py").write_text("TIMEOUT = undefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "HANDLER": "raising_handlers.f"}}
    with pytest.raises(CommandError) as raised:
        run_burst()
    assert str(raised.value) == (
        "DELAYQUEUES['default']['HANDLER'] is 'raising_handlers.f', but importing "
        "'raising_handlers' raised NameError: name 'undefined_name' is not defined\nHINT: Fix "
        'that module; python manage.py shell -c "import raising_handlers" shows the traceback.'
    )


def test_invalid_settings_are_a_command_error(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "ftp://x"}}
    with pytest.raises(CommandError, match=re.escape("delayqueue_django.E007")):
        run_burst()


@pytest.fixture
def running_worker() -> Iterator[Callable[..., Worker]]:
    started: list[tuple[Worker, threading.Thread]] = []

    def start(queue: Queue, **options: Any) -> Worker:
        options.setdefault("heartbeat_interval", 0.2)
        worker = Worker([(queue, handle)], **options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.request_stop()
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_no_handler_starts_before_send_call_start_plus_delay(
    worker_queue: Callable[..., Queue],
) -> None:
    # As the issue measured it, side by side with other queues: a trickle of messages with
    # sub-millisecond delays, each handler's start against this machine's clock.
    queue = worker_queue()
    trickle = random.Random(19)
    earliest: dict[int, float] = {}
    started: dict[int, float] = {}

    def record_start(message: Message) -> None:
        started[message.payload] = time.time()

    worker = Worker([(queue, record_start)], heartbeat_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for index in range(300):
            delay = trickle.uniform(0, 0.01)
            earliest[index] = time.time() + delay
            queue.send(index, delay=delay)
            time.sleep(trickle.uniform(0, 0.002))
        wait_for(lambda: len(started) == len(earliest), what="every message handled")
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    early = {index: earliest[index] - at for index, at in started.items() if at < earliest[index]}
    assert early == {}  # how early each one started, in seconds


def test_an_idle_worker_wakes_for_a_message_due_sooner_than_its_plan(
    worker_queue: Callable[..., Queue], running_worker: Callable[..., Worker]
) -> None:
    queue = worker_queue()
    queue.send({"n": "far"}, delay=3600)
    running_worker(queue)
    time.sleep(0.3)  # the worker is asleep until the far message (or its 30 s recheck)
    message_id = queue.send({"n": "soon"}, delay=0.2)
    wait_for(lambda: events("done"), timeout=5, what="the handler")
    assert [e["id"] for e in events("done")] == [message_id]


def test_at_a_trickle_the_worker_fetches_about_once_per_message(
    worker_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each message is sent to an idle worker, due a little later: its wake-up announces the
    # due time, so a fetch at once would find nothing, and neither would one after the ack
    # (the last fetch already said when the next message is due: none).
    queue = worker_queue()
    fetches: list[int] = []
    real_fetch = Queue.fetch

    def counting_fetch(self: Queue, count: int | None = None, **kw: Any) -> Any:
        fetched = real_fetch(self, count, **kw)
        fetches.append(len(fetched.messages))
        return fetched

    monkeypatch.setattr(Queue, "fetch", counting_fetch)
    earliest: dict[int, float] = {}
    started: dict[int, float] = {}

    def record_start(message: Message) -> None:
        started[message.payload] = time.time()

    worker = Worker([(queue, record_start)], heartbeat_interval=10)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: fetches, what="the worker's first fetch")
        messages = 20
        for index in range(messages):
            earliest[index] = time.time() + 0.03
            queue.send(index, delay=0.03)
            wait_for(lambda: len(started) == len(earliest), what="the message handled")
            time.sleep(0.02)  # its ack is committed meanwhile
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    early = {index: earliest[index] - at for index, at in started.items() if at < earliest[index]}
    assert early == {}
    # One fetch per message, the first one at start, and the odd fetch woken a hair before
    # a due time (the Redis clock is estimated); before, three per message.
    empty = [count for count in fetches if count == 0]
    assert sum(fetches) == messages
    assert len(empty) <= 1 + messages // 4, fetches


def test_messages_due_while_no_worker_ran_are_handled_at_start(
    worker_queue: Callable[..., Queue], running_worker: Callable[..., Worker]
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=0.1)
    overdue = queue.send({"n": 1}, delay=0.05)
    queue.send({"n": 2})
    [abandoned] = queue.fetch(1).messages  # a worker that died holding it
    time.sleep(0.15)
    running_worker(queue)
    wait_for(lambda: len(events("done")) == 2, what="both messages")
    assert {e["id"] for e in events("done")} == {overdue, abandoned.id}


def test_heartbeats_show_live_workers_and_vanish_when_they_stop(
    worker_queue: Callable[..., Queue], running_worker: Callable[..., Worker]
) -> None:
    queue = worker_queue()
    worker = running_worker(queue, concurrency=2)
    [live] = wait_for(lambda: heartbeat.live_workers(queue), what="a heartbeat")
    assert live["id"] == worker.worker_id
    assert live["queues"] == ["default"]
    assert live["concurrency"] == 2
    assert {"host", "pid", "started", "handled", "failed", "last_seen"} <= set(live)
    worker.request_stop()
    wait_for(lambda: heartbeat.live_workers(queue) == [], what="the heartbeat to go")


def test_an_idle_worker_sends_almost_no_commands(
    redis_worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    redis_server: RedisServer,
) -> None:
    queue = redis_worker_queue()
    queue.send({"n": "far"}, delay=3600)
    running_worker(queue, heartbeat_interval=10)
    time.sleep(0.5)
    client = redis_server.client()

    def calls() -> int:
        stats = client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    before = calls()
    time.sleep(3)
    # No polling: blocking waits, rare heartbeats, a PING of the quiet subscription.
    assert calls() - before <= 3


@pytest.mark.parametrize("options", [{}, {"RATE_LIMIT": "100/s", "MAX_IN_FLIGHT": 50}])
def test_between_its_30_s_duties_an_idle_worker_sends_only_its_heartbeat_and_keep_alive(
    redis_worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    redis_server: RedisServer,
    options: dict[str, Any],
) -> None:
    """What the performance page's table of an idle worker's duties says, counted by
    MONITOR, every request named by its function: each heartbeat (a SET and a SADD, and the
    pause note's flow read) and the wake-up subscription's PING after 3 s of silence. The
    re-check, the schedules' read and the garbage expiry come at start and every 30 or 60 s;
    flow options add no refresh of their own."""
    queue = redis_worker_queue(**options)
    running_worker(queue, heartbeat_interval=1)
    time.sleep(1.5)  # past its start, which runs every duty once
    probe = redis_server.client()
    probe.ping()  # its connection opened before: MONITOR would see its greeting
    with Monitored(probe) as monitored:
        time.sleep(4)
    calls = monitored.client_calls
    assert set(calls) <= {"set", "sadd", "fcall flow", "ping"}, calls
    assert 3 <= calls["set"] == calls["sadd"] <= 5, calls
    assert calls["ping"] <= 2, calls


@pytest.fixture
def own_redis(settings: Any) -> Iterator[RedisServer]:
    """A Redis of this test's own, to stop and restart, with the default queue on it."""
    server = RedisServer()
    settings.DELAYQUEUES = {
        "default": {"URL": server.url, "HANDLER": "tests.worker_handlers.handle"}
    }
    yield server
    server.close()


def test_the_worker_survives_a_redis_restart(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    queue = get_queue()
    worker = Worker([(queue, handle)], heartbeat_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        thread.start()
        time.sleep(0.3)
        own_redis.stop()
        time.sleep(1.0)  # the worker keeps trying while Redis is down
        own_redis.start()
        message_id = wait_for(lambda: _try_send(queue), timeout=10, what="Redis back")
        wait_for(lambda: events("done"), timeout=10, what="the handler after the restart")
    assert [e["id"] for e in events("done")] == [message_id]
    assert thread.is_alive()
    # Idle, it meets the outage at its heartbeat or its subscription: said once, and its end.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    address = f"127.0.0.1:{own_redis.port}"
    assert [w.split(",")[0] for w in warnings] == [
        f"cannot reach Redis at {address}",
        f"connected to Redis at {address} again",
    ]
    worker.request_stop()
    thread.join(timeout=10)
    assert not thread.is_alive()


def _try_send(queue: Queue) -> str | None:
    from redis.exceptions import RedisError

    try:
        return queue.send({"n": "after restart"})
    except RedisError:
        return None


def test_the_next_batch_is_fetched_before_the_handlers_run_dry(
    redis_worker_queue: Callable[..., Queue], running_worker: Callable[..., Worker]
) -> None:
    queue = redis_worker_queue()
    queue.send_many([{"do": "sleep", "seconds": 0.005, "count_unack": True}] * 60)
    running_worker(queue, batch_size=10)
    wait_for(lambda: len(events("done")) == 60, timeout=15, what="all handled")
    in_flight = [start["unack"] for start in events("start")]
    # Fetching only once the pool is empty, the last message of every batch would start
    # alone. (The first batches ramp up; the last ones run out of messages.)
    assert min(in_flight[20:-10]) >= 2, in_flight


def test_no_fetch_takes_more_than_the_batch_size_even_with_more_threads(
    redis_worker_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = redis_worker_queue()
    asked: list[int | None] = []
    real_fetch = Queue.fetch

    def recording_fetch(self: Queue, count: int | None = None, **kw: Any) -> Any:
        asked.append(count)
        return real_fetch(self, count, **kw)

    monkeypatch.setattr(Queue, "fetch", recording_fetch)
    queue.send_many([{"do": "sleep", "seconds": 0.01}] * 12)
    Worker([(queue, handle)], concurrency=4, batch_size=2, burst=True).run()
    assert len(events("done")) == 12
    assert asked
    assert all(count is not None and 1 <= count <= 2 for count in asked), asked


def test_a_fetch_whose_reply_was_lost_is_repeated_and_its_messages_handled_at_once(
    redis_worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis.exceptions import TimeoutError as RedisTimeout

    queue = redis_worker_queue(MAX_CONSUME_DURATION=30)
    lost: list[Any] = []
    real_fetch = Queue.fetch

    def fetch_losing_the_first_reply(self: Queue, count: int | None = None, **kw: Any) -> Any:
        fetched = real_fetch(self, count, **kw)
        if fetched.messages and not lost:
            lost.extend(fetched.messages)  # Redis ran it; the worker never hears back
            raise RedisTimeout("Timeout reading from socket (the reply is lost on purpose)")
        return fetched

    monkeypatch.setattr(Queue, "fetch", fetch_losing_the_first_reply)
    message_id = queue.send({"n": 1})
    running_worker(queue)
    # Not after the 30 s deadline, and without using up an attempt.
    wait_for(lambda: events("done"), timeout=10, what="the message handled")
    assert [m.id for m in lost] == [message_id]
    assert [(e["id"], e["attempt"]) for e in events("start")] == [(message_id, 1)]


def test_verdicts_that_arrive_while_a_commit_is_under_way_share_the_next_one(
    redis_worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
    unblock: threading.Event,
) -> None:
    # Timed by events, not by the machine's speed (a count of round trips for 120 sleeping
    # handlers went over its bound on a loaded CI machine): eight handlers finish at once,
    # and the first commit is slow, so every verdict but those it took waits for the next.
    queue = redis_worker_queue()
    acks: list[int] = []
    real_ack = Queue.ack

    def slow_counting_ack(self: Queue, messages: Any, **named: Any) -> set[str]:
        messages = list(messages)
        acks.append(len(messages))
        time.sleep(0.5)
        return real_ack(self, messages, **named)

    monkeypatch.setattr(Queue, "ack", slow_counting_ack)
    queue.send_many([{"do": "block"}] * 8)
    running_worker(queue, concurrency=8, batch_size=8)
    wait_for(lambda: len(events("start")) == 8, what="all eight handlers running")
    unblock.set()
    wait_for(lambda: sum(acks) == 8, timeout=15, what="all acked")
    # One round trip per message would be eight.
    assert len(acks) <= 2, acks


def test_a_verdict_that_completes_what_the_worker_holds_is_committed_at_once(
    redis_worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
    unblock: threading.Event,
) -> None:
    """At a trickle the wait for other verdicts to share a commit would only make each ack
    late (and cost Redis a cold call): a verdict that leaves nothing else in hand goes at
    once. While another delivery is still running, verdicts still wait for it."""
    from delayqueue_django.worker.consumer import state as consumer_state

    monkeypatch.setattr(consumer_state, "VERDICT_FLUSH_SECONDS", 30)
    queue = redis_worker_queue()
    running_worker(queue, concurrency=2, batch_size=2)
    queue.send({"n": "alone"})
    wait_for(lambda: queue.stats()["acked_total"] == 1, timeout=5, what="the lone ack")

    queue.send_many([{"do": "block"}, {"n": "quick"}])
    wait_for(lambda: len(events("done")) == 2, what="the quick one handled")
    time.sleep(0.3)  # a commit of the quick one alone would have landed by now
    assert queue.stats()["acked_total"] == 1  # it waits for the running one
    unblock.set()
    wait_for(lambda: queue.stats()["acked_total"] == 3, timeout=5, what="both acked together")


def test_a_stale_buffered_message_is_handed_back_not_started(
    worker_queue: Callable[..., Queue], running_worker: Callable[..., Worker]
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=2)  # slack: 0.2 s
    slow = queue.send({"do": "sleep", "seconds": 0.6})
    waiting = queue.send({"n": "waits in the buffer"})
    running_worker(queue, batch_size=2)
    wait_for(lambda: len(events("done")) == 2, timeout=10, what="both handled")
    starts = {e["id"]: e["attempt"] for e in events("start")}
    assert starts == {slow: 1, waiting: 1}  # handed back without using a retry


@pytest.fixture
def unblock() -> Iterator[threading.Event]:
    """``UNBLOCK``, set at the end of the test (before the workers are stopped: request it
    after ``running_worker``) so that no "block" handler outlives it."""
    UNBLOCK.clear()
    yield UNBLOCK
    UNBLOCK.set()


def test_a_worker_stuck_in_a_handler_charges_nothing_it_never_started(
    worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    unblock: threading.Event,
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=3, RETRY_COUNT=0)  # slack: 0.3 s
    # Heartbeats far away: they must not be what gets this worker to look at its buffer.
    running_worker(queue, batch_size=8, heartbeat_interval=3600)
    # Fast handlers first: this worker's batch grows to 8.
    queue.send_many([{"n": n} for n in range(20)])
    wait_for(lambda: len(events("done")) == 20, what="the warm-up")
    blocker = queue.send({"do": "block"})
    wait_for(lambda: blocker in {e["id"] for e in events("start")}, what="the blocking handler")
    # Its only thread is stuck, yet while the handler is young it fetches ahead: all seven,
    # so that nothing is left due and it plans to look again only at the deadlines.
    ordinary = queue.send_many([{"n": n} for n in range(7)])
    wait_for(lambda: queue.stats()["unack"] == 8, what="the stuck worker to fetch ahead")
    running_worker(queue, heartbeat_interval=3600)

    wait_for(
        lambda: set(ordinary) <= {e["id"] for e in events("acked")},
        timeout=10,
        what="every ordinary message handled",
    )
    # Handed back once they outlasted the slack, not left to their deadline (before, they
    # waited in the stuck worker's buffer until another worker's fetch found them expired,
    # and with no retry left buried them unhandled).
    stored = queue.peek(blocker)
    assert stored is not None
    assert stored.state == "unack"
    starts = [(e["id"], e["attempt"]) for e in events("start") if e["id"] in ordinary]
    assert sorted(starts) == sorted((message_id, 1) for message_id in ordinary)
    # The blocker did start: at its deadline it is delivered again, and with no retry left
    # buried. Nothing else is.
    wait_for(lambda: queue.stats()["garbage"] == 1, timeout=10, what="the blocker's deadline")
    assert [entry.id for entry in queue.list_messages("garbage")] == [blocker]
    assert queue.stats()["unack"] == 0


def test_a_worker_whose_handler_outlasts_the_slack_fetches_only_for_free_threads(
    worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    unblock: threading.Event,
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=2)  # slack: 0.2 s
    running_worker(queue, batch_size=8, concurrency=2)
    queue.send_many([{"n": n} for n in range(20)])
    wait_for(lambda: len(events("done")) == 20, what="the warm-up")
    queue.send({"do": "block"})
    wait_for(lambda: len(events("start")) == 21, what="the blocking handler")
    time.sleep(0.3)  # past the slack
    later = queue.send_many([{"do": "sleep", "seconds": 0.02, "count_unack": True}] * 6)

    wait_for(lambda: set(later) <= {e["id"] for e in events("done")}, what="the later ones")
    # One thread is left: each fetch takes one message for it, none to wait behind it.
    in_flight = [e["unack"] for e in events("start") if e["id"] in later]
    assert max(in_flight) == 2, in_flight  # the blocker and the one starting


def test_a_hand_back_wakes_another_queues_consumer_waiting_for_room(
    redis_server: RedisServer, settings: Any, unblock: threading.Event
) -> None:
    """Room in the shared pool freed by a hand-back, not by a thread, is room all the same:
    the consumer of another queue that found none is woken to fetch. (Both queues log to
    the same server.)"""
    options = {"URL": redis_server.url, "HANDLER": "tests.worker_handlers.handle"}
    settings.DELAYQUEUES = {
        "default": {**options, "MAX_CONSUME_DURATION": 5},  # slack: 0.5 s
        "other": {**options, "MAX_CONSUME_DURATION": 30},  # slack: 1 s
    }
    first, other = get_queue("default"), get_queue("other")
    # No heartbeat and no idle re-check (see _no_safety_net) to wake the consumers.
    worker = Worker(
        [(first, handle), (other, handle)], concurrency=2, batch_size=8, heartbeat_interval=3600
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        # Fast handlers first: both queues' batches grow to 8.
        warm_up = [*first.send_many([{"n": n} for n in range(20)])]
        warm_up += other.send_many([{"n": n} for n in range(20)])
        wait_for(lambda: len(events("done")) == 40, what="the warm-up")
        # Both threads blocked, six more fetched ahead behind them: the pool holds the
        # other queue's batch, so its consumer finds no room for what is sent to it now.
        first.send_many([{"do": "block"}] * 8)
        wait_for(lambda: first.stats()["unack"] == 8, what="the first queue's fetch")
        waiting = other.send_many([{"n": n} for n in range(3)])
        time.sleep(0.1)
        assert other.stats()["unack"] == 0  # none fetched
        # At the slack the six go back; two threads stay blocked, and the other queue's
        # consumer may fetch again: it must be told.
        wait_for(lambda: first.stats()["unack"] == 2, what="the hand-back")
        wait_for(lambda: other.stats()["unack"] == 3, timeout=2, what="the other queue's fetch")
        unblock.set()
        wait_for(
            lambda: set(waiting) <= {e["id"] for e in events("done")},
            what="the other queue's messages handled",
        )
    finally:
        unblock.set()
        worker.request_stop()
        runner.join(timeout=10)


def test_a_hung_handler_is_logged_while_it_runs_and_shown_in_the_heartbeat(
    worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    unblock: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=1)
    message_id = queue.send({"do": "block"})
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        running_worker(queue, heartbeat_interval=0.1)

        def running() -> list[dict[str, Any]]:
            return [h for w in heartbeat.live_workers(queue) for h in w.get("running", [])]

        [young] = wait_for(lambda: [h for h in running() if h["age"] > 0], what="a heartbeat")
        assert young == {**young, "id": message_id, "queue": "default", "attempt": 1}
        assert young["past_deadline"] is False
        [late] = wait_for(lambda: [h for h in running() if h["past_deadline"]], what="a late one")
        assert late["id"] == message_id
        assert late["age"] >= 0.9
        overrun = "handler still running past its deadline (MAX_CONSUME_DURATION), for "
        wait_for(lambda: overrun in caplog.text, what="the overrun logged while it runs")
        time.sleep(0.5)  # more turns of the consumer loop: it is logged once per delivery
    assert caplog.text.count(overrun) == 1
    assert f"message id={message_id} queue=default attempt=1 will be delivered again" in caplog.text
    unblock.set()
    wait_for(lambda: running() == [], what="the handler gone from the heartbeat")


def test_a_worker_waiting_out_its_grace_for_a_late_handler_does_not_spin(
    worker_queue: Callable[..., Queue],
    running_worker: Callable[..., Worker],
    unblock: threading.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from delayqueue_django.worker import consumer

    queue = worker_queue(MAX_CONSUME_DURATION=0.3)
    queue.send({"do": "block"})
    worker = running_worker(queue, grace=10)
    wait_for(lambda: events("start"), what="the blocking handler")
    # Stopping, no housekeeping runs: the heartbeat due every 0.2 s and the handler's deadline
    # pass, and nothing moves them on.
    worker.request_stop()
    turns = []
    real_wait = consumer.QueueConsumer._wait

    def counting_wait(self: consumer.QueueConsumer, seconds: float) -> None:
        turns.append(seconds)
        real_wait(self, seconds)

    monkeypatch.setattr(consumer.QueueConsumer, "_wait", counting_wait)
    time.sleep(0.6)
    assert len(turns) < 30, len(turns)  # a turn every 0.1 s, not a busy loop
    unblock.set()


def test_a_handler_overrunning_its_deadline_is_logged(
    worker_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = worker_queue(MAX_CONSUME_DURATION=0.2)
    message_id = queue.send({"do": "sleep", "seconds": 0.4})
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        call_command("run_delayqueue", burst=True, max_messages=1, stdout=StringIO())
    assert "handler overran MAX_CONSUME_DURATION by " in caplog.text
    assert f"message id={message_id} queue=default may already have been delivered" in caplog.text


def test_a_stopping_worker_does_not_complain_about_its_own_connections(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker([(get_queue(), handle)])
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="delayqueue_django"):
        thread.start()
        time.sleep(0.3)
        worker.request_stop()
        thread.join(timeout=10)
        own_redis.stop()
        time.sleep(1.5)  # the listener notices the closed connection after its 1 s poll
    assert "subscription" not in caplog.text
    assert "cannot reach Redis" not in caplog.text


def test_an_unexpected_error_in_the_loop_is_logged_and_the_worker_carries_on(
    worker_queue: Callable[..., Queue],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from delayqueue_django.worker import consumer

    queue = worker_queue()
    queue.send({"n": 1})
    failures = iter([ValueError("a bug"), None])
    real_housekeeping = consumer.QueueConsumer._housekeeping

    def flaky(self: consumer.QueueConsumer) -> None:
        error = next(failures, None)
        if error is not None:
            raise error
        real_housekeeping(self)

    monkeypatch.setattr(consumer.QueueConsumer, "_housekeeping", flaky)
    with caplog.at_level(logging.ERROR, logger="delayqueue_django"):
        run_burst()
    assert "unexpected error in the consumer loop queue=default" in caplog.text
    assert len(events("done")) == 1


@pytest.mark.cluster
def test_the_worker_runs_on_redis_cluster(settings: Any, redis_cluster: Any) -> None:
    redis_cluster.flush()
    settings.DELAYQUEUES = {
        "default": {
            "URL": redis_cluster.url,
            "HANDLER": "tests.worker_handlers.handle",
            "NACK_REDELIVERY_DELAY": 0,
            "RETRY_COUNT": 1,
        }
    }
    queue = get_queue()
    ids = queue.send_many([{"n": n} for n in range(20)])
    failing = queue.send({"do": "raise"})
    worker = Worker([(queue, handle)], heartbeat_interval=0.2, burst=True)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert sorted(e["id"] for e in events("done")) == sorted(ids)
    assert [e["id"] for e in events("exhausted")] == [failing]
    assert queue.stats()["unannounced"] == 0
    heartbeat.beat(queue, "probe", {"host": "h", "pid": 1}, ttl_seconds=5)
    assert heartbeat.live_workers(queue) == [{"id": "probe", "host": "h", "pid": 1}]
    heartbeat.forget(queue, "probe")
    assert heartbeat.live_workers(queue) == []


def test_jitter_delays_the_start_and_the_worker_then_runs(
    redis_worker_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    redis_worker_queue().send({"n": 1})
    with caplog.at_level(logging.INFO, logger="delayqueue_django"):
        run_burst(jitter=0.2, verbosity=1)
    assert "start-up jitter: waiting" in caplog.text
    assert len(events("done")) == 1


def test_queues_sharing_one_handler_thread_all_get_it_back(settings: Any, worker_url: str) -> None:
    handler = "tests.worker_handlers.handle"
    settings.DELAYQUEUES = {
        name: {"URL": worker_url, "KEY_PREFIX": name, "HANDLER": handler}
        for name in ("first", "second", "third")
    }
    ids = [
        get_queue(name).send({"n": name}) for name in ("first", "second", "third") for _ in range(3)
    ]
    # The heartbeat an hour away too: only the freed thread may wake the other queues.
    call_command("run_delayqueue", burst=True, heartbeat=3600, stdout=StringIO())
    done = [entry["id"] for entry in read_log("first") if entry["event"] == "done"]
    assert sorted(done) == sorted(ids)


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
def test_a_worker_process_of_its_own_refuses_a_memory_queue(
    settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayqueue_django.management.commands.run_delayqueue import Command

    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": "tests.worker_handlers.handle"}
    }
    with pytest.raises(SystemExit) as exited:  # as manage.py run_delayqueue would
        Command().run_from_argv(["manage.py", "run_delayqueue", "--burst"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "CommandError: queue 'default' keeps its messages in the memory of the process that "
        "sends them (memory://); a process of its own would never see them. Run the worker in "
        "that process (delayqueue_django.worker.start_worker_thread(), or "
        "call_command('run_delayqueue', burst=True) in tests), or give the queue a Redis URL.\n"
    )


def test_a_worker_thread_runs_a_memory_queue_in_the_sending_process(settings: Any) -> None:
    from delayqueue_django.worker import start_worker_thread

    settings.DELAYQUEUES = {
        "default": {"URL": "memory://", "HANDLER": "tests.worker_handlers.handle"}
    }
    with start_worker_thread(heartbeat_interval=0.2) as running:
        message_id = get_queue().send({"n": 1}, delay=0.1)
        wait_for(lambda: events("acked"), what="the handler")
        assert heartbeat.live_workers(get_queue())[0]["id"] == running.worker.worker_id
    assert not running.thread.is_alive()
    assert [e["id"] for e in events("done")] == [message_id]
    assert heartbeat.live_workers(get_queue()) == []


def test_a_worker_thread_on_a_memory_queue_wakes_when_the_test_moves_the_clock(
    settings: Any,
) -> None:
    from delayqueue_django.testing import memory_queues
    from delayqueue_django.worker import start_worker_thread

    settings.DELAYQUEUES = {
        "default": {"REDIS": "redis", "HANDLER": "tests.worker_handlers.handle"}
    }
    with memory_queues() as queues, start_worker_thread():
        message_id = get_queue().send({"n": 1}, delay=3600)
        time.sleep(0.2)
        assert events("start") == []  # an hour away on the queues' clock
        queues.advance(3600)
        wait_for(lambda: events("acked"), what="the handler, woken by the clock")
        assert [e["id"] for e in events("done")] == [message_id]
