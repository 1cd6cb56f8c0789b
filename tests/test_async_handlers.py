"""``async def`` handlers: awaited on the worker's event loop (never acked unrun), with every
verdict a sync handler has; a sync handler returning an awaitable refused; TIME_LIMIT a real
cancellation; a handler blocking the loop reported; ``current_message()`` in both kinds."""

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core import checks
from django.core.exceptions import SynchronousOnlyOperation
from django.core.management import CommandError, call_command
from django.db import connections

from delayqueue_django import Message, current_message, get_queue, signals
from delayqueue_django.core.handlers import resolve
from delayqueue_django.exceptions import (
    HandlerReturnedAwaitable,
    Postpone,
    Reject,
    Retry,
    TimeLimitExceeded,
)
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.testing import memory_queues
from delayqueue_django.worker import Worker
from delayqueue_django.worker.handling import Verdict
from tests.conftest import close_async_orm_connections
from tests.redis_servers import RedisServer
from tests.task_app.models import Effect

RAN: list[tuple[str, Any]] = []
# Tasks a handler spawned (strong references, as asyncio asks).
SPAWNED: set[asyncio.Task[None]] = set()


async def verdict_handler(message: Message) -> Any:
    """Does what its payload says, after a real await (so it ran on a loop)."""
    await asyncio.sleep(0)
    RAN.append((message.payload["do"], current_message()))
    do = message.payload["do"]
    if do == "ack":
        return None
    if do == "true":
        return True
    if do == "false":
        return False
    if do == "raise":
        raise RuntimeError("boom")
    if do == "postpone":
        raise Postpone(5)
    if do == "retry":
        raise Retry(7)
    if do == "reject":
        raise Reject("never")
    if do == "sleep":
        await asyncio.sleep(message.payload["seconds"])
        return None
    if do == "shrug_off_cancel":
        try:
            await asyncio.sleep(message.payload["seconds"])
        except asyncio.CancelledError:
            await asyncio.sleep(message.payload["seconds"])  # and carries on
        return None
    if do == "spawn_exit":
        # A task of its own (a library's, say) that calls sys.exit() once the handler is done.
        async def exits() -> None:
            await asyncio.sleep(0.05)
            raise SystemExit(3)

        SPAWNED.add(asyncio.get_running_loop().create_task(exits()))
        return None
    if do == "block":
        time.sleep(message.payload["seconds"])
        return None
    raise AssertionError(do)


async def _never_awaited(message: Message) -> None:
    RAN.append(("coroutine body ran", message.id))


def sync_returning_coroutine(message: Message) -> Any:
    """A sync handler that forgot to await: it returns the coroutine."""
    return _never_awaited(message)


async def orm_handler(message: Message) -> None:
    """The async ORM, a sync ORM call wrapped for a thread, and (when asked) a sync ORM call
    made on the loop, which Django refuses."""
    await Effect.objects.acreate(message_id=message.id, pid=1)
    await sync_to_async(Effect.objects.create, thread_sensitive=False)(message_id=message.id, pid=2)
    if message.payload.get("sync_call"):
        Effect.objects.create(message_id=message.id, pid=3)


async def async_returning_coroutine(message: Message) -> Any:
    """An async handler that forgot to await what it returns: ``return send(...)``."""
    await asyncio.sleep(0)
    return _never_awaited(message)


async def async_generator_handler(message: Message) -> Any:
    """``yield`` where ``await`` was meant: an async generator function, not async def."""
    RAN.append(("async generator body ran", message.id))
    yield message.id


def sync_handler(message: Message) -> None:
    RAN.append(("sync", current_message()))


class AsyncCallable:
    async def __call__(self, message: Message) -> None:
        RAN.append(("callable", message.id))


async_callable = AsyncCallable()


@pytest.fixture(autouse=True)
def _forget() -> None:
    RAN.clear()


def configure(settings: Any, url: str, handler: str = "verdict_handler", **options: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": url,
            "HANDLER": f"tests.test_async_handlers.{handler}",
            "NACK_REDELIVERY_DELAY": 0,
            **options,
        }
    }


VERDICTS = {
    "ack": Verdict.ACK,
    "true": Verdict.ACK,
    "false": Verdict.NACK,
    "raise": Verdict.NACK,
    "postpone": Verdict.NACK,
    "retry": Verdict.NACK,
    "reject": Verdict.BURY,
}


def test_every_verdict_of_an_async_handler_in_memory_queues(settings: Any) -> None:
    configure(settings, "memory://", RETRY_COUNT=0)
    with memory_queues() as queues:
        sent = {do: get_queue().send({"do": do}) for do in VERDICTS}
        outcomes = {outcome.message.id: outcome for outcome in queues.run_due()}
    for do, verdict in VERDICTS.items():
        outcome = outcomes[sent[do]]
        assert outcome.verdict is verdict, do
    assert outcomes[sent["postpone"]].postponed
    assert outcomes[sent["postpone"]].delay_ms == 5000
    assert outcomes[sent["retry"]].delay_ms == 7000
    assert isinstance(outcomes[sent["raise"]].error, RuntimeError)
    # The handler saw its own message as the current one.
    assert {message.id for _, message in RAN} == set(sent.values())


def test_arun_due_awaits_async_handlers_from_an_async_test(settings: Any) -> None:
    configure(settings, "memory://", RETRY_COUNT=0)

    async def scenario() -> dict[str, Verdict]:
        outcomes = await queues.arun_due()
        return {outcome.message.id: outcome.verdict for outcome in outcomes}

    with memory_queues() as queues:
        acked = get_queue().send({"do": "ack"})
        rejected = get_queue().send({"do": "reject"})
        # As an async test runs (pytest-asyncio and the like): the test's own loop.
        assert asyncio.run(scenario()) == {acked: Verdict.ACK, rejected: Verdict.BURY}


def test_a_sync_handler_returning_a_coroutine_is_refused_never_acked(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    configure(settings, "memory://", "sync_returning_coroutine", RETRY_COUNT=0)
    with memory_queues() as queues, caplog.at_level(logging.ERROR):
        get_queue().send({"order": 1})
        [outcome] = queues.run_due()
        assert outcome.verdict is Verdict.NACK
        assert isinstance(outcome.error, HandlerReturnedAwaitable)
        assert "tests.test_async_handlers.sync_returning_coroutine" in str(outcome.error)
        assert "async def" in str(outcome.error)
        # Dead-lettered (no retries), not acked: there for a person to requeue.
        assert get_queue().stats()["garbage"] == 1
    assert RAN == []
    assert "returned coroutine" in caplog.text


def test_a_sync_handler_returning_a_coroutine_is_refused_by_the_worker_on_redis(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url, "sync_returning_coroutine", RETRY_COUNT=0)
    queue = get_queue()
    queue.send({"order": 1})
    nacked: list[Any] = []

    def on_nacked(*, error: Any, **kwargs: Any) -> None:
        nacked.append(error)

    signals.message_nacked.connect(on_nacked)
    try:
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    finally:
        signals.message_nacked.disconnect(on_nacked)
    [error] = nacked
    assert isinstance(error, HandlerReturnedAwaitable)
    assert queue.stats()["garbage"] == 1
    assert RAN == []


def test_every_verdict_of_an_async_handler_through_the_worker_on_redis(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url, RETRY_COUNT=0)
    queue = get_queue()
    sent = {do: queue.send({"do": do}) for do in VERDICTS}
    seen: dict[str, list[str]] = {"acked": [], "nacked": [], "postponed": []}

    def on(kind: str) -> Callable[..., None]:
        def receiver(*, message: Any, **kwargs: Any) -> None:
            seen[kind].append(message.id)

        return receiver

    receivers = {
        signals.message_acked: on("acked"),
        signals.message_nacked: on("nacked"),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        worker = Worker([(queue, resolve(queue.config))], burst=True, async_concurrency=10)
        worker.run()
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert sorted(seen["acked"]) == sorted([sent["ack"], sent["true"]])
    # Refused: False, an exception, Retry, Reject (its own verdict, nacked signal too?)
    assert sent["false"] in seen["nacked"]
    assert sent["raise"] in seen["nacked"]
    assert sent["retry"] in seen["nacked"]
    stats = queue.stats()
    # Postponed: waiting again, no attempt used; the others dead (no retries).
    assert stats["pending"] == 1
    assert stats["garbage"] == 4
    assert {do for do, _ in RAN} == set(VERDICTS)


def test_an_async_callable_object_is_awaited(redis_server: RedisServer, settings: Any) -> None:
    configure(settings, redis_server.url, "async_callable")
    sent = get_queue().send({})
    call_command("run_delayqueue", burst=True, stdout=StringIO())
    assert [("callable", sent)] == RAN


def test_a_time_limit_cancels_the_async_handler_and_the_others_go_on(
    redis_server: RedisServer, settings: Any
) -> None:
    """The issue's proof: a 10 s handler with TIME_LIMIT 1 is cancelled at 1 s while 99
    others finish."""
    configure(settings, redis_server.url, TIME_LIMIT=1, RETRY_COUNT=0)
    queue = get_queue()
    slow = queue.send({"do": "sleep", "seconds": 10})
    quick = [queue.send({"do": "sleep", "seconds": 0.2}) for _ in range(99)]
    nacked: list[Any] = []
    started = time.monotonic()

    def on_nacked(*, message: Any, error: Any, **kwargs: Any) -> None:
        nacked.append((message.id, error, time.monotonic() - started))

    signals.message_nacked.connect(on_nacked)
    try:
        worker = Worker([(queue, resolve(queue.config))], burst=True, async_concurrency=100)
        worker.run()
    finally:
        signals.message_nacked.disconnect(on_nacked)
    [(refused, error, at)] = nacked
    assert refused == slow
    assert isinstance(error, TimeLimitExceeded)
    assert "cancelled" in str(error)
    assert worker.handled == len(quick) + 1
    assert sum(do == "sleep" for do, _ in RAN) == 100
    # Cancelled at its limit (its refusal committed a moment after), not run to its 10 s.
    assert 1.0 <= at < 3.0
    assert worker.details()["time_limit_overruns"] == 1


def test_a_handler_blocking_the_loop_is_reported_with_its_message_and_place(
    redis_server: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    configure(settings, redis_server.url)
    queue = get_queue()
    blocking = queue.send({"do": "block", "seconds": 1.0})
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        worker = Worker([(queue, resolve(queue.config))], burst=True)
        worker.run()
    [record] = [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    text = record.getMessage()
    assert f"message id={blocking}" in text
    assert "test_async_handlers.py" in text
    assert "time.sleep" in text
    details = worker.details()
    assert details["loop_blocks"] == 1
    # Measured from the look that found it blocked: up to a look's interval (0.1 s) short.
    assert 0.7 < details["loop_blocked_seconds"] < 3
    # Added to the queue's totals (with the stop's last heartbeat), for the metrics.
    totals = queue.store.totals()
    assert totals["event_loop_blocked:count"] == 1
    assert 700_000 < totals["event_loop_blocked:sum_us"] < 3_000_000


def test_sync_and_async_queues_in_one_worker(redis_server: RedisServer, settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "HANDLER": "tests.test_async_handlers.sync_handler"},
        "async": {
            "URL": redis_server.url,
            "HANDLER": "tests.test_async_handlers.verdict_handler",
        },
    }
    plain = get_queue("default").send({})
    awaited = get_queue("async").send({"do": "ack"})
    out = StringIO()
    call_command("run_delayqueue", burst=True, async_concurrency=5, stdout=out)
    assert sorted((kind, message.id) for kind, message in RAN) == sorted(
        [("sync", plain), ("ack", awaited)]
    )
    assert "async concurrency 5 on an event loop" in out.getvalue()
    assert "async handler tests.test_async_handlers.verdict_handler" in out.getvalue()


def test_async_signal_receivers_are_awaited_on_the_workers_loop(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url)
    sent = get_queue().send({"do": "ack"})
    awaited_in: list[tuple[str, str]] = []

    async def on_acked(*, message: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        awaited_in.append((message.id, threading.current_thread().name))

    signals.message_acked.connect(on_acked)
    try:
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    finally:
        signals.message_acked.disconnect(on_acked)
    assert awaited_in == [(sent, "delayqueue-event-loop")]


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
def test_exactly_once_with_an_async_handler_is_refused_by_a_check(settings: Any) -> None:
    configure(settings, "memory://", EXACTLY_ONCE=True)
    errors = [e for e in checks.run_checks() if e.id == "delayqueue_django.E029"]
    [error] = errors
    assert "EXACTLY_ONCE" in error.msg
    assert "tests.test_async_handlers.verdict_handler" in error.msg
    with pytest.raises(CommandError, match="EXACTLY_ONCE"):
        call_command("run_delayqueue", burst=True, stdout=StringIO())


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
@pytest.mark.parametrize("value", [0, -1, "fast", 120, float("nan")])
def test_a_bad_loop_blocked_after_setting_is_a_check_error(settings: Any, value: Any) -> None:
    settings.DELAYQUEUE_LOOP_BLOCKED_AFTER = value
    [error] = [e for e in checks.run_checks() if e.id == "delayqueue_django.E070"]
    assert "DELAYQUEUE_LOOP_BLOCKED_AFTER" in error.msg


def test_current_message_is_none_outside_a_handler_and_set_in_a_sync_one(settings: Any) -> None:
    configure(settings, "memory://", "sync_handler")
    assert current_message() is None
    with memory_queues() as queues:
        sent = get_queue().send({})
        queues.run_due()
    [(kind, message)] = RAN
    assert (kind, message.id) == ("sync", sent)
    assert current_message() is None


@pytest.mark.django_db(transaction=True)
def test_an_async_handler_uses_the_async_orm_and_a_sync_orm_call_is_refused(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url, "orm_handler", RETRY_COUNT=0)
    queue = get_queue()
    written = queue.send({})
    refused = queue.send({"sync_call": True})
    nacked: list[Any] = []

    def on_nacked(*, message: Any, error: Any, **kwargs: Any) -> None:
        nacked.append((message.id, error))

    signals.message_nacked.connect(on_nacked)
    try:
        call_command("run_delayqueue", burst=True, async_concurrency=10, stdout=StringIO())
    finally:
        signals.message_nacked.disconnect(on_nacked)
        close_async_orm_connections()
    rows = sorted(Effect.objects.values_list("message_id", "pid"))
    assert rows == sorted([(written, 1), (written, 2), (refused, 1), (refused, 2)])
    [(refused_id, error)] = nacked
    assert refused_id == refused
    assert isinstance(error, SynchronousOnlyOperation)


def test_a_heartbeat_names_the_longest_running_handlers_and_counts_them_all(
    redis_server: RedisServer, settings: Any
) -> None:
    configure(settings, redis_server.url)
    queue = get_queue()
    for _ in range(30):
        queue.send({"do": "sleep", "seconds": 1.0})
    worker = Worker([(queue, resolve(queue.config))], burst=True, async_concurrency=50)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while worker.details()["running_count"] < 30 and time.monotonic() < deadline:
            time.sleep(0.02)
        details = worker.details()
    finally:
        thread.join()
    assert details["running_count"] == 30
    assert len(details["running"]) == 20


def test_a_ticks_schedule_is_read_off_the_event_loop(
    redis_server: RedisServer, settings: Any
) -> None:
    """An async queue's tick is judged by its schedule, read from Redis in a thread: the
    loop's thread never waits on Redis for it."""
    configure(settings, redis_server.url)
    queue = get_queue()
    queue.schedules.add("often", every=1, payload={"do": "ack"})
    read_in: list[str] = []
    real = ScheduleRunner.declines

    def spied(self: ScheduleRunner, message: Message) -> bool:
        read_in.append(threading.current_thread().name)
        return real(self, message)

    ScheduleRunner.declines = spied  # type: ignore[method-assign,assignment]
    try:
        time.sleep(1.1)  # its first tick falls due
        call_command("run_delayqueue", burst=True, stdout=StringIO())
    finally:
        ScheduleRunner.declines = real  # type: ignore[method-assign]
    assert read_in
    assert "delayqueue-event-loop" not in read_in
    assert [do for do, _ in RAN][:1] == ["ack"]


@pytest.mark.django_db(transaction=True)
def test_the_async_orms_connection_is_refreshed_around_each_handler(
    redis_server: RedisServer, settings: Any
) -> None:
    """With CONN_MAX_AGE 0 a connection is obsolete once its request ends: the worker
    closes the async ORM's after each async handler, as Django does after a request."""
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    configure(settings, redis_server.url, "orm_handler")
    get_queue().send({})

    def orm_thread_connection_open() -> bool:
        opened: list[bool] = []

        def look() -> None:
            opened.append(connections["default"].connection is not None)

        thread = threading.Thread(
            target=asyncio.run, args=(sync_to_async(look, thread_sensitive=True)(),)
        )
        thread.start()
        thread.join()
        return opened[0]

    try:
        call_command("run_delayqueue", burst=True, stdout=StringIO())
        assert Effect.objects.count() == 2  # the handler ran, and used the async ORM
        assert not orm_thread_connection_open()
    finally:
        close_async_orm_connections()


def test_a_system_exit_in_a_task_a_handler_spawned_does_not_end_the_event_loop(
    redis_server: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio lets SystemExit and KeyboardInterrupt out of ``run_forever``: the loop's
    thread would end, the coroutines on it never finish, and the worker goes on fetching
    for a loop that runs nothing, handing it all back, forever."""
    configure(settings, redis_server.url)
    queue = get_queue()
    queue.send({"do": "spawn_exit"})
    later = [queue.send({"do": "sleep", "seconds": 0.3}) for _ in range(5)]
    worker = Worker([(queue, resolve(queue.config))], burst=True, async_concurrency=10)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.ERROR, logger="delayqueue_django.worker"):
        thread.start()
        thread.join(10)
    if thread.is_alive():
        worker.request_stop()
        worker.request_stop()
        thread.join(5)
    assert worker.handled == 1 + len(later)
    assert queue.stats()["pending"] == 0
    assert any("SystemExit" in record.getMessage() for record in caplog.records)


def test_an_async_handler_that_carries_on_past_its_cancellation_is_reported(
    redis_server: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """It cannot be stopped, as a sync handler past TIME_LIMIT cannot: it is told as that
    one is, a warning and an overrun counted, not kept quiet."""
    configure(settings, redis_server.url, TIME_LIMIT=0.2)
    queue = get_queue()
    queue.send({"do": "shrug_off_cancel", "seconds": 0.3})
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        worker = Worker([(queue, resolve(queue.config))], burst=True)
        worker.run()
    assert worker.handled == 1  # its verdict is its own: it returned
    assert worker.details()["time_limit_overruns"] == 1
    assert any("past TIME_LIMIT (0.2 s)" in record.getMessage() for record in caplog.records)


def test_an_async_handler_returning_a_coroutine_is_refused_never_acked(
    redis_server: RedisServer, settings: Any
) -> None:
    """``return client.post(...)`` with the await forgotten: what it returned never ran,
    as a sync handler's returned coroutine never does."""
    configure(settings, redis_server.url, "async_returning_coroutine", RETRY_COUNT=0)
    queue = get_queue()
    queue.send({"order": 1})
    nacked: list[Any] = []

    def on_nacked(*, error: Any, **kwargs: Any) -> None:
        nacked.append(error)

    signals.message_nacked.connect(on_nacked)
    try:
        Worker([(queue, resolve(queue.config))], burst=True).run()
    finally:
        signals.message_nacked.disconnect(on_nacked)
    [error] = nacked
    assert isinstance(error, HandlerReturnedAwaitable)
    assert "tests.test_async_handlers.async_returning_coroutine" in str(error)
    assert queue.stats()["garbage"] == 1
    assert RAN == []


def test_an_async_generator_handler_is_refused_never_acked(settings: Any) -> None:
    """Calling it only makes an async generator, which is no awaitable: its body never
    runs, and an ack would lose the message as a sync handler's coroutine did."""
    configure(settings, "memory://", "async_generator_handler", RETRY_COUNT=0)
    with memory_queues() as queues:
        get_queue().send({"order": 1})
        [outcome] = queues.run_due()
        assert outcome.verdict is Verdict.NACK
        assert isinstance(outcome.error, HandlerReturnedAwaitable)
        assert "async_generator" in str(outcome.error)
        assert get_queue().stats()["garbage"] == 1
    assert RAN == []
