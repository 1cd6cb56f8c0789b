"""The Django Tasks backend: enqueue, run by run_delayqueue, results in Redis, signals,
retries, refusal of anything that is not a task, and its system checks."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import OperationalError, connections, transaction
from django.utils import timezone

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.placement import shard_name, shard_of
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.exceptions import TimeLimitExceeded
from delayqueue_django.outbox.models import ProcessedMessage
from delayqueue_django.tasks.backend import DelayQueueBackend
from delayqueue_django.tasks.call import TaskCall
from delayqueue_django.tasks.compat import (
    INVALID_TASK_NAMES,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    invalid_task_error,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from delayqueue_django.tasks.results import call_fields
from delayqueue_django.tasks.runner import _record_failure, run_task
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler
from delayqueue_django.worker.verdicts import announce_exhaustions
from tests.databases import database_params
from tests.helpers import fetch_when_due, redis_store, wait_for
from tests.redis_servers import RedisServer
from tests.task_app import tasks
from tests.task_app.models import Effect
from tests.tcp_relay import TcpRelay

BACKEND = "delayqueue_django.tasks.DelayQueueBackend"
# The installed framework's package of backends, and its backend that runs a task at once.
FRAMEWORK_BACKENDS = BaseTaskBackend.__module__.rpartition(".")[0]
IMMEDIATE_BACKEND = f"{FRAMEWORK_BACKENDS}.immediate.ImmediateBackend"


def _tasks_configurer(url: str, settings: Any) -> Callable[..., Queue]:
    def configure(result_ttl: Any = timedelta(days=7), **options: Any) -> Queue:
        settings.DELAYQUEUES = {
            "default": {"URL": url, "NACK_REDELIVERY_DELAY": 0, **options},
            "other": {"URL": url},
            "second": {"URL": url},
        }
        settings.TASKS = {
            "default": {
                "BACKEND": BACKEND,
                "QUEUES": ["default"],
                "OPTIONS": {"RESULT_TTL": result_ttl},
            },
            # A second DelayQueueBackend, with a queue of its own.
            "second": {"BACKEND": BACKEND, "QUEUES": ["second"]},
            # A backend of another kind, which would take the default queue's name.
            "elsewhere": {"BACKEND": IMMEDIATE_BACKEND, "QUEUES": ["default"]},
        }
        return get_queue("default")

    return configure


@pytest.fixture(params=["redis", "memory"])
def tasks_queue(
    request: pytest.FixtureRequest, settings: Any, redis_server: RedisServer
) -> Callable[..., Queue]:
    """``tasks_queue(result_ttl, **queue_options)``: the default queue, carrying the tasks
    of a default DelayQueueBackend; on Redis, and on the memory store."""
    url = redis_server.url if request.param == "redis" else "memory://"
    return _tasks_configurer(url, settings)


@pytest.fixture
def redis_tasks_queue(settings: Any, redis_server: RedisServer) -> Callable[..., Queue]:
    """``tasks_queue`` on Redis only, for what is about Redis's keys."""
    return _tasks_configurer(redis_server.url, settings)


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    tasks.calls.clear()
    tasks.flaky_failures_left["n"] = 0
    tasks.unimportable_exits["exit"] = False


@pytest.fixture
def received() -> Iterator[list[tuple[str, TaskResultStatus, int]]]:
    """The framework's signals as (signal, status, attempts) in the order they fired."""
    log: list[tuple[str, TaskResultStatus, int]] = []
    receivers = []
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receiver(
            sender: Any, task_result: TaskResult[..., Any], name: str = name, **_: Any
        ) -> None:
            assert sender is DelayQueueBackend
            log.append((name, task_result.status, task_result.attempts))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    yield log
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def refreshed(result: TaskResult[..., Any]) -> TaskResult[..., Any]:
    result.refresh()
    return result


def work(*queues: str) -> None:
    call_command("run_delayqueue", *(queues or ["default"]), burst=True, verbosity=0)


def test_a_task_is_enqueued_run_and_its_result_read_from_any_process(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    queue = tasks_queue()
    result = tasks.add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert queue.peek(result.id) is not None  # the result id is the message id
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
    assert received == [("enqueued", TaskResultStatus.READY, 0)]

    work()

    assert tasks.calls == [("add", (2, 3))]
    result = refreshed(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1
    assert result.started_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert received[1:] == [
        ("started", TaskResultStatus.RUNNING, 1),
        ("finished", TaskResultStatus.SUCCESSFUL, 1),
    ]
    # A fresh backend (as in another process, on Redis) reads the same result.
    other = DelayQueueBackend("default", {"QUEUES": ["default"]})
    assert other.get_result(result.id).return_value == 5
    assert queue.stats()["pending"] == 0


def test_run_after_becomes_the_message_due_time(tasks_queue: Callable[..., Queue]) -> None:
    queue = tasks_queue()
    when = timezone.now() + timedelta(hours=2)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    stored = queue.peek(result.id)
    assert stored is not None
    # Rounded up to the ms, as every due time is (never early).
    micros = (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert (stored.state, stored.score_ms) == ("pending", -(-micros // 1000))
    work()
    assert tasks.calls == []
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY


def test_failed_runs_are_retried_under_the_queue_rules_and_each_attempt_recorded(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    tasks_queue(RETRY_COUNT=2)
    result = tasks.always_fails.enqueue("boom")

    work()

    result.refresh()
    assert tasks.calls == [("always_fails", "boom")] * 3
    assert result.status == TaskResultStatus.FAILED
    assert len(result.worker_ids) == 3
    assert [error.exception_class for error in result.errors] == [ValueError] * 3
    assert "ValueError: boom" in result.errors[-1].traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    # Started each attempt; finished once, at the end.
    assert [entry[0] for entry in received] == ["enqueued"] + ["started"] * 3 + ["finished"]
    assert received[-1] == ("finished", TaskResultStatus.FAILED, 3)
    assert get_queue("default").stats()["garbage"] == 1


def test_a_task_that_raises_reject_fails_at_once_with_its_own_error(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    # Before: recorded READY (retries were left), then, its message buried, recorded FAILED
    # by the exhaustion receiver with TaskAbandoned in place of the task's own error.
    queue = tasks_queue(RETRY_COUNT=3)
    result = tasks.rejects.enqueue("refund window closed")

    work()

    result.refresh()
    assert tasks.calls == [("rejects", "refund window closed")]
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert [error.exception_class_path for error in result.errors] == [
        "delayqueue_django.exceptions.Reject"
    ]
    assert "refund window closed" in result.errors[0].traceback
    assert received[-1] == ("finished", TaskResultStatus.FAILED, 1)
    assert [entry[0] for entry in received].count("finished") == 1
    stored = queue.peek(result.id)
    assert stored is not None
    assert stored.state == "garbage"


def test_a_backend_with_no_queues_enqueues_nothing(
    tasks_queue: Callable[..., Queue], settings: Any
) -> None:
    # Before: the framework lets a backend with empty QUEUES take any queue_name, so the
    # task was sent to whatever DELAYQUEUES queue it named, one with a handler of its own
    # included, whose handler got the task call as its payload (E101 says so, too late).
    tasks_queue()
    settings.DELAYQUEUES = {**settings.DELAYQUEUES, "payments": {"URL": "memory://"}}
    settings.TASKS = {**settings.TASKS, "default": {"BACKEND": BACKEND, "QUEUES": []}}
    moved = tasks.add.using(queue_name="payments")
    with pytest.raises(InvalidTask, match=r"TASKS\['default'\]\['QUEUES'\] is empty"):
        moved.enqueue(1, 2)
    with pytest.raises(InvalidTask, match=r"TASKS\['default'\]\['QUEUES'\] is empty"):
        asyncio.run(moved.aenqueue(1, 2))
    assert get_queue("payments").stats()["pending"] == 0


def test_a_failure_with_retries_left_goes_back_to_ready(tasks_queue: Callable[..., Queue]) -> None:
    tasks_queue(RETRY_COUNT=3, NACK_REDELIVERY_DELAY=3600)
    tasks.flaky_failures_left["n"] = 1
    result = tasks.flaky.enqueue()

    work()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert [error.exception_class for error in result.errors] == [RuntimeError]
    assert result.finished_at is None

    get_queue("default").deliver_now([result.id])
    work()
    result = refreshed(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "finally"
    assert len(result.worker_ids) == 2
    assert len(result.errors) == 1


def test_context_async_tasks_and_unencodable_return_values(
    tasks_queue: Callable[..., Queue],
) -> None:
    tasks_queue(RETRY_COUNT=0)
    with_context = tasks.which_attempt.enqueue()
    coroutine = tasks.async_double.enqueue(21)
    unencodable = tasks.returns_something_json_cannot_carry.enqueue()

    work()

    for result in (with_context, coroutine, unencodable):
        result.refresh()
    assert with_context.return_value == 1
    doubled: Any = coroutine.return_value
    assert doubled == 42
    assert unencodable.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in unencodable.errors] == [TypeError]


def test_aenqueue_and_aget_result(tasks_queue: Callable[..., Queue]) -> None:
    tasks_queue()

    async def enqueue() -> TaskResult[..., Any]:
        result = await tasks.add.aenqueue(20, 22)
        return await tasks.add.aget_result(result.id)

    result = asyncio.run(enqueue())
    assert result.status == TaskResultStatus.READY
    work()
    result.refresh()
    assert result.return_value == 42


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("options", [{}, {"SEND_ON_COMMIT": True}, {"OUTBOX": True}])
def test_aenqueue_announces_in_the_sync_world_on_every_kind_of_queue(
    tasks_queue: Callable[..., Queue], settings: Any, options: dict[str, Any]
) -> None:
    # Before: on a SEND_ON_COMMIT or OUTBOX queue, aenqueue raised SynchronousOnlyOperation
    # after the message was sent (a caller retrying it sent it twice); and task_enqueued's
    # sync receivers ran in the event loop, where the ORM refuses to.
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    tasks_queue(**options)
    counted: list[int] = []

    def receiver(sender: Any, task_result: TaskResult[..., Any], **_: Any) -> None:
        counted.append(Effect.objects.count())

    task_enqueued.connect(receiver, weak=False)
    try:
        result = asyncio.run(tasks.add.aenqueue(20, 22))
    finally:
        task_enqueued.disconnect(receiver)

    assert counted == [0]
    assert refreshed(result).status == TaskResultStatus.READY
    work()
    assert refreshed(result).return_value == 42


def test_results_expire_after_result_ttl_or_never(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    # The memory store's expiry is tested with its clock moved (test_engine_memory).
    queue = redis_tasks_queue(result_ttl=120)
    result = tasks.add.enqueue(1, 2)
    work()
    client = redis_store(queue).client
    assert 110 <= client.ttl(queue.store.keys.key(f"task:{result.id}")) <= 120

    queue = redis_tasks_queue(result_ttl=None)
    result = tasks.add.enqueue(1, 2)
    work()
    assert client.ttl(queue.store.keys.key(f"task:{result.id}")) == -1


def test_unknown_result_ids_raise_does_not_exist(tasks_queue: Callable[..., Queue]) -> None:
    queue = tasks_queue()
    plain = queue.send({"not": "a task"})
    # Messages shaped as tasks, but not ones this backend would run from this queue.
    foreign = queue.send(raw_task_message(task="tests.task_app.tasks.declared_elsewhere", args=[]))
    misplaced = queue.send(raw_task_message(queue="other"))
    for result_id in ("missing", plain, "", foreign, misplaced):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result_id)


def test_validation_refuses_what_the_backend_cannot_do(tasks_queue: Callable[..., Queue]) -> None:
    tasks_queue()
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=10)
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
        tasks.add.using(queue_name="elsewhere")
    with pytest.raises(InvalidTask, match="aware datetime"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))
    # Moved onto a DelayQueueBackend from a backend of another kind: a worker would refuse it.
    with pytest.raises(InvalidTask, match=r"declared for TASKS\['elsewhere'\], which is not a"):
        tasks.declared_elsewhere.using(backend="default")


def raw_task_message(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "task": "tests.task_app.tasks.add",
        "backend": "default",
        "queue": "default",
        "args": [1, 2],
        "kwargs": {},
        "enqueued_at": timezone.now().isoformat(),
        "run_after": None,
    }
    return {**payload, **changes}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (raw_task_message(task="tests.task_app.tasks.not_a_task"), "is a function, not a task"),
        (raw_task_message(task="os.system"), "is a builtin_function_or_method, not a task"),
        (raw_task_message(task="antigravity.geohash"), "outside every installed app"),
        (raw_task_message(task="tests.task_app.tasks.nothing"), "cannot be imported"),
        (raw_task_message(task="tests.task_app.tasks.calls"), "is a list, not a task"),
        (raw_task_message(backend="nope"), "no TASKS backend named 'nope'"),
        (raw_task_message(queue="other"), "does not carry the tasks"),
        (
            raw_task_message(task="tests.task_app.tasks.declared_elsewhere", args=[]),
            "declared for TASKS['elsewhere'], which is not a DelayQueueBackend",
        ),
        (raw_task_message(run_after="2020-01-01T00:00:00"), "run_after must be an aware"),
        (raw_task_message(run_after="soon"), "run_after 'soon' is not an ISO 8601"),
        (raw_task_message(enqueued_at=12), "enqueued_at 12 is not an ISO 8601"),
        (raw_task_message(task="add; rm -rf /"), "is not a dotted import path"),
        ({"task": "tests.task_app.tasks.add"}, "not a task message"),
        (["tests.task_app.tasks.add"], "not a task message"),
    ],
)
def test_anything_but_a_task_of_this_backend_is_refused_and_dead_lettered(
    tasks_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture, payload: Any, reason: str
) -> None:
    queue = tasks_queue(RETRY_COUNT=5)
    message_id = queue.send(payload)

    work()

    assert tasks.calls == []
    assert "antigravity" not in sys.modules  # refused without importing it
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"  # at once, whatever the retries left
    assert reason in caplog.text
    assert queue.store.read_result(message_id) == {}


@pytest.mark.parametrize(
    ("exits", "reason"), [(False, "RuntimeError: SHOP_API_KEY is not set"), (True, "SystemExit: 3")]
)
def test_a_task_module_that_raises_on_import_is_refused_at_once(
    tasks_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture, exits: bool, reason: str
) -> None:
    # Before: anything but ImportError escaped the lookup, so the message was retried
    # (RETRY_COUNT times, a traceback each), the exhaustion receiver failed on it too, and
    # get_result raised it.
    tasks.unimportable_exits["exit"] = exits
    queue = tasks_queue(RETRY_COUNT=5)
    message_id = queue.send(raw_task_message(task="tests.task_app.unimportable.job"))

    work()

    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.state, stored.attempt) == ("garbage", 1)
    assert f"'tests.task_app.unimportable.job' cannot be imported: {reason}" in caplog.text
    assert "unimportable.py" in caplog.text  # where the import failed, with its traceback
    assert "signal receiver" not in caplog.text
    assert queue.store.read_result(message_id) == {}
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(message_id)


def test_a_task_whose_last_delivery_timed_out_is_recorded_as_failed(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    queue = tasks_queue(RETRY_COUNT=0, MAX_CONSUME_DURATION=0.05)
    result = tasks.add.enqueue(1, 2)
    # A worker takes it and dies before running it: its lease runs out.
    [taken] = queue.fetch().messages
    assert taken.id == result.id
    import time

    time.sleep(0.1)

    work()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == [
        "delayqueue_django.exceptions.TaskAbandoned"
    ]
    assert received[-1] == ("finished", TaskResultStatus.FAILED, 0)
    assert tasks.calls == []


def _rolled_back_task_fails(
    redis_tasks_queue: Callable[..., Queue],
    received: list[Any],
    database: str,
    rolls_back: Task[[str], str],
    error_path: str = "delayqueue_django.outbox.exactly_once.RolledBack",
    says: str = "set_rollback(True)",
) -> None:
    """Regression (issue #25, defect 4): on an EXACTLY_ONCE queue a task whose transaction
    rolled back was recorded SUCCESSFUL with its return value (each attempt), while nothing
    was committed and its message ended a dead letter."""
    queue = redis_tasks_queue(RETRY_COUNT=1, EXACTLY_ONCE=database)
    result = rolls_back.enqueue(database)

    work()

    result.refresh()
    assert Effect.objects.using(database).count() == 0
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == [error_path] * 2
    assert says in result.errors[-1].traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert [entry for entry in received if entry[0] == "finished"] == [
        ("finished", TaskResultStatus.FAILED, 2)
    ]
    stored = queue.peek(result.id)
    assert stored is not None
    assert stored.state == "garbage"


@pytest.mark.parametrize("database", database_params(("default", "postgresql", "mariadb")))
def test_a_task_whose_exactly_once_transaction_was_marked_for_rollback_fails(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    _rolled_back_task_fails(redis_tasks_queue, received, database, tasks.writes_then_rolls_back)


@pytest.mark.parametrize("database", database_params(("postgresql",)))
def test_a_task_that_caught_an_error_aborting_its_exactly_once_transaction_fails(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    _rolled_back_task_fails(
        redis_tasks_queue, received, database, tasks.writes_then_catches_an_error
    )


@pytest.mark.parametrize("database", database_params(("default", "postgresql")))
def test_a_task_whose_worker_died_before_its_exactly_once_commit_ends_failed(
    redis_tasks_queue: Callable[..., Queue], database: str
) -> None:
    """SUCCESSFUL is written just before the COMMIT: a worker killed between the two, on
    the last attempt, left a SUCCESSFUL result with nothing committed."""
    queue = redis_tasks_queue(RETRY_COUNT=0, MAX_CONSUME_DURATION=0.05, EXACTLY_ONCE=database)
    result = tasks.add.enqueue(1, 2)
    [taken] = queue.fetch().messages
    # What the dying worker wrote before its COMMIT, which never came.
    records = DelayQueueBackend("default", {"QUEUES": ["default"]}).records(queue)
    records.write(
        taken.id, {**call_fields(TaskCall.from_payload(taken.payload)), "status": "RUNNING"}
    )
    records.write(taken.id, {"status": TaskResultStatus.SUCCESSFUL, "return_value": "3"})
    wait_for(
        lambda: queue.stats()["server_time_ms"] > taken.deadline_ms,
        what="the dead worker's delivery to time out",
    )

    work()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == [
        "delayqueue_django.exceptions.TaskAbandoned"
    ]
    assert tasks.calls == []


@pytest.mark.parametrize("database", database_params(("postgresql",)))
def test_a_task_whose_exactly_once_commit_fails_fails(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    """The task returned and its transaction looked sound; its COMMIT failed (a deferred
    foreign key): its SUCCESSFUL, written before the COMMIT, is undone."""
    _rolled_back_task_fails(
        redis_tasks_queue,
        received,
        database,
        tasks.writes_what_its_commit_refuses,
        error_path="django.db.utils.IntegrityError",
        says="dq_orphan",
    )


@contextmanager
def commit_gate(database: str) -> Iterator[None]:
    """Holds the COMMIT of ``tasks.commits_behind_a_gate`` on ``database`` until the block
    ends. PostgreSQL: the advisory lock its deferred trigger waits for, taken on a
    connection of the gate's own. SQLite: a read transaction of this thread's, which a
    COMMIT waits for (the busy timeout: 5 s); this thread's reads in the block see the
    database as it was before."""
    if connections[database].vendor == "postgresql":
        wrapper = connections[database]
        raw = wrapper.get_new_connection(wrapper.get_connection_params())
        raw.autocommit = True
        try:
            raw.execute("SELECT pg_advisory_lock(%s)", [tasks.COMMIT_GATE])
            yield
        finally:
            raw.close()
        return
    with transaction.atomic(using=database):
        Effect.objects.using(database).exists()
        yield


@pytest.mark.parametrize("database", database_params(("default", "postgresql")))
def test_a_task_whose_exhaustion_is_announced_before_its_commit_ends_successful(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    """Regression: the last attempt outlived its lease, and the exhaustion's announcement
    ran between its SUCCESSFUL and its COMMIT: it found no processed record and recorded
    FAILED; the COMMIT then succeeded. Effects committed, the task FAILED."""
    queue = redis_tasks_queue(RETRY_COUNT=0, MAX_CONSUME_DURATION=0.2, EXACTLY_ONCE=database)
    result = tasks.commits_behind_a_gate.enqueue(database)
    [taken] = queue.fetch().messages
    records = DelayQueueBackend("default", {"QUEUES": ["default"]}).records(queue)
    outcomes: list[Outcome] = []
    with commit_gate(database):
        runner = threading.Thread(target=lambda: outcomes.append(call_handler(run_task, taken)))
        runner.start()
        wait_for(
            lambda: records.read(taken.id).get("status") == TaskResultStatus.SUCCESSFUL,
            what="SUCCESSFUL written before the COMMIT",
        )
        wait_for(
            lambda: queue.stats()["server_time_ms"] > taken.deadline_ms,
            what="the last attempt's lease to lapse",
        )
        assert queue.fetch().messages == []  # it buries the timed-out last attempt
        announce_exhaustions(queue)
        # The announcement found no processed record: the COMMIT has not come.
        assert records.read(taken.id)["status"] == TaskResultStatus.FAILED
    runner.join(30)

    assert [outcome.verdict for outcome in outcomes] == [Verdict.ACK]
    assert Effect.objects.using(database).count() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "done"
    finished = [entry[1] for entry in received if entry[0] == "finished"]
    assert finished == [TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL]


@pytest.mark.parametrize("database", database_params(("postgresql",)))
def test_a_task_whose_commit_reply_is_lost_on_the_wire_is_successful_at_its_redelivery(
    redis_tasks_queue: Callable[..., Queue], database: str
) -> None:
    """Regression, a reply really lost: the worker's connection goes through a TCP relay,
    which stops forwarding while its COMMIT waits at the gate; the server commits, then
    the connection is cut. The attempt was recorded READY, and stayed so: the redelivery
    was acked as processed before."""
    queue = redis_tasks_queue(RETRY_COUNT=1, EXACTLY_ONCE=database)
    result = tasks.commits_behind_a_gate.enqueue(database)
    [taken] = queue.fetch().messages
    relay = TcpRelay(int(connections[database].settings_dict["PORT"]))
    outcomes: list[Outcome] = []

    def run_through_the_relay() -> None:
        wrapper = connections[database]  # this thread's own, not connected yet
        wrapper.settings_dict = {**wrapper.settings_dict, "HOST": "127.0.0.1", "PORT": relay.port}
        outcomes.append(call_handler(run_task, taken))

    def waiting_at_the_gate() -> bool:
        with connections[database].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    runner = threading.Thread(target=run_through_the_relay)
    try:
        with commit_gate(database):
            runner.start()
            wait_for(waiting_at_the_gate, timeout=10, what="the task's COMMIT at the gate")
            assert relay.freeze() == 1
        # The gate open, the server commits; its reply stays in the relay.
        wait_for(
            ProcessedMessage.objects.using(database).filter(message_id=taken.id).exists,
            what="the server's commit",
        )
    finally:
        relay.close()  # the worker's connection cut: its COMMIT fails, for all it knows
        runner.join(30)
    assert [outcome.verdict for outcome in outcomes] == [Verdict.NACK]
    assert tasks.commits_behind_a_gate.get_result(result.id).status == TaskResultStatus.READY
    queue.nack([taken])  # as the worker does with that outcome

    [again] = fetch_when_due(queue)
    assert call_handler(run_task, again).verdict is Verdict.ACK
    assert Effect.objects.using(database).count() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "done"


def _lose_the_commit_reply(queue: Queue, database: str, *, last: bool) -> str:
    """A task run whose COMMIT succeeded on the server while the worker got an error: run
    it, then record what run_task records for a failed COMMIT (on_rollback), and hand the
    message back as the worker would. Returns its id."""
    result = tasks.add.enqueue(1, 2)
    [taken] = queue.fetch().messages
    assert call_handler(run_task, taken).verdict is Verdict.ACK  # committed, not acked
    backend = DelayQueueBackend("default", {"QUEUES": ["default"]})
    error = OperationalError("server closed the connection unexpectedly")
    call, task = TaskCall.from_payload(taken.payload), tasks.add
    _record_failure(backend, task, call, taken.id, taken.attempt, error, last=last)
    queue.nack([taken])
    return result.id


@pytest.mark.parametrize("database", database_params(("default", "postgresql")))
def test_a_task_whose_commit_reply_was_lost_is_successful_at_its_redelivery(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    """Regression: a COMMIT the server made whose reply the worker lost recorded the
    attempt as failed (READY); the redelivery, acked as processed before without running
    the task, left the result READY for good."""
    queue = redis_tasks_queue(RETRY_COUNT=1, EXACTLY_ONCE=database)
    result_id = _lose_the_commit_reply(queue, database, last=False)
    assert tasks.add.get_result(result_id).status == TaskResultStatus.READY
    received.clear()
    [again] = fetch_when_due(queue)
    assert call_handler(run_task, again).verdict is Verdict.ACK
    assert tasks.calls == [("add", (1, 2))]  # once

    result = tasks.add.get_result(result_id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3  # what the committed run wrote before its COMMIT
    finished = [entry[1] for entry in received if entry[0] == "finished"]
    assert finished == [TaskResultStatus.SUCCESSFUL]


@pytest.mark.parametrize("database", database_params(("default", "postgresql")))
def test_a_task_whose_last_commit_reply_was_lost_is_successful_at_its_exhaustion(
    redis_tasks_queue: Callable[..., Queue], received: list[Any], database: str
) -> None:
    """Regression: the same on the last attempt recorded FAILED; the message buried, the
    exhaustion's announcement kept FAILED, though the processed record proves success."""
    queue = redis_tasks_queue(RETRY_COUNT=0, EXACTLY_ONCE=database)
    result_id = _lose_the_commit_reply(queue, database, last=True)
    assert tasks.add.get_result(result_id).status == TaskResultStatus.FAILED
    received.clear()
    announce_exhaustions(queue)

    result = tasks.add.get_result(result_id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    finished = [entry[1] for entry in received if entry[0] == "finished"]
    assert finished == [TaskResultStatus.SUCCESSFUL]


@pytest.mark.django_db(transaction=True)
def test_on_a_send_on_commit_queue_the_task_is_enqueued_with_the_transaction(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    queue = tasks_queue(SEND_ON_COMMIT=True)
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 1)
        assert queue.peek(kept.id) is None
        assert received == []
    assert queue.peek(kept.id) is not None
    assert received == [("enqueued", TaskResultStatus.READY, 0)]

    dropped = []
    with transaction.atomic():
        dropped.append(tasks.add.enqueue(2, 2))
        transaction.set_rollback(True)
    assert queue.peek(dropped[0].id) is None
    assert len(received) == 1


@pytest.mark.django_db(transaction=True)
def test_on_an_outbox_queue_the_task_is_enqueued_with_the_transaction(
    tasks_queue: Callable[..., Queue], received: list[Any], settings: Any
) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    queue = tasks_queue(OUTBOX=True)
    with transaction.atomic():
        kept = tasks.add.enqueue(2, 3)
        assert received == []
    # Committed: in the outbox, not yet in Redis, and READY all the same.
    assert queue.peek(kept.id) is None
    assert received == [("enqueued", TaskResultStatus.READY, 0)]
    assert refreshed(kept).status == TaskResultStatus.READY
    with transaction.atomic():
        dropped = tasks.add.enqueue(4, 4)
        transaction.set_rollback(True)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(dropped.id)

    work()  # relays the outbox first, then runs what is due
    assert refreshed(kept).status == TaskResultStatus.SUCCESSFUL
    assert kept.return_value == 5
    assert tasks.calls == [("add", (2, 3))]


def checks_of(settings: Any, tasks_setting: dict[str, Any]) -> list[str]:
    settings.TASKS = tasks_setting
    return [f"{error.id}: {error.msg}" for error in task_backends["default"].check()]


def test_checks_report_configuration_errors(
    tasks_queue: Callable[..., Queue], settings: Any
) -> None:
    tasks_queue()
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}) == []
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": []}}) == [
        "delayqueue_django.E101: TASKS['default']['QUEUES'] is empty; list the DELAYQUEUES queues this backend sends tasks to."
    ]
    assert checks_of(
        settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "gone"]}}
    ) == [
        "delayqueue_django.E102: TASKS['default']['QUEUES'] names 'gone', which is not in DELAYQUEUES."
    ]
    settings.DELAYQUEUES = {"default": {"URL": "redis://localhost/0", "HANDLER": "x.y"}}
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}) == [
        "delayqueue_django.E103: DELAYQUEUES['default'] carries tasks of TASKS['default'] but also has a handler of its own; a task queue's messages are run as tasks."
    ]
    tasks_queue()
    assert checks_of(
        settings,
        {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"RESULT_TTL": "1d"}}},
    ) == [
        "delayqueue_django.E104: TASKS['default']: OPTIONS['RESULT_TTL'] must be seconds, a timedelta or None, not '1d'"
    ]
    assert checks_of(
        settings,
        {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"RESULT_TTL": 0}}},
    ) == [
        "delayqueue_django.E104: TASKS['default']: OPTIONS['RESULT_TTL'] must be at least one second, not 0"
    ]


def test_a_task_queue_with_invalid_options_is_not_reported_missing(settings: Any) -> None:
    # Before: any DELAYQUEUES error made every task queue read as absent (a false E102).
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://localhost/0", "RETRY_COUNT": -1},
        "other": {"URL": "ftp://x"},
    }
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}) == []
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["gone"]}}) == [
        "delayqueue_django.E102: TASKS['default']['QUEUES'] names 'gone', which is not in DELAYQUEUES."
    ]
    settings.DELAYQUEUES = ["not", "a", "dict"]  # E001 says it all
    assert checks_of(settings, {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}) == []


def test_the_record_holds_the_call_and_per_attempt_fields(
    tasks_queue: Callable[..., Queue],
) -> None:
    queue = tasks_queue()
    result = tasks.add.enqueue(3, 4)
    work()
    record = queue.store.read_result(result.id)
    assert json.loads(record["call"])["task"] == "tests.task_app.tasks.add"
    assert set(record) == {
        "call",
        "status",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "return_value",
        "worker:1",
    }


def test_tasks_in_a_users_test_with_the_memory_helpers(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    from delayqueue_django.testing import memory_queues

    redis_tasks_queue(RETRY_COUNT=1)
    with memory_queues() as queues:
        later = tasks.add.using(run_after=queues.now + timedelta(hours=1)).enqueue(2, 3)
        failing = tasks.always_fails.enqueue("no luck")
        assert [sent.delay for sent in queues.sent()] == [timedelta(hours=1), timedelta(0)]

        queues.run_due()
        assert refreshed(later).status == TaskResultStatus.READY
        assert refreshed(failing).status == TaskResultStatus.FAILED  # both attempts, no wait
        assert len(refreshed(failing).errors) == 2

        queues.advance(timedelta(hours=1))
        queues.run_due()
        assert (refreshed(later).status, refreshed(later).return_value) == (
            TaskResultStatus.SUCCESSFUL,
            5,
        )
    assert tasks.calls == [("always_fails", "no luck")] * 2 + [("add", (2, 3))]


@pytest.fixture
def started_tasks() -> Iterator[list[Task[..., Any]]]:
    """The tasks as the worker rebuilt them, from ``task_started``."""
    started: list[Task[..., Any]] = []

    def receiver(sender: Any, task_result: TaskResult[..., Any], **_: Any) -> None:
        started.append(task_result.task)

    task_started.connect(receiver, weak=False)
    yield started
    task_started.disconnect(receiver)


def assert_read_back_as_enqueued(
    read: TaskResult[..., Any], enqueued: TaskResult[..., Any]
) -> None:
    # Task equality covers func, backend, queue_name, run_after, priority and takes_context.
    assert read.task == enqueued.task
    assert (read.id, read.backend, read.args, read.kwargs, read.enqueued_at) == (
        enqueued.id,
        enqueued.backend,
        enqueued.args,
        enqueued.kwargs,
        enqueued.enqueued_at,
    )


def test_tasks_of_a_second_delayqueue_backend_run_and_read_back_as_enqueued(
    tasks_queue: Callable[..., Queue], started_tasks: list[Task[..., Any]]
) -> None:
    tasks_queue()
    second = task_backends["second"]
    later = timezone.now() + timedelta(hours=1)
    enqueued = [
        # Declared for the second backend.
        tasks.multiply.using(run_after=later).enqueue(6, 7),
        # Declared for the default one, moved onto the second (the framework allows it).
        tasks.add.using(backend="second", queue_name="second", run_after=later).enqueue(2, b=3),
    ]
    for result in enqueued:
        assert (result.task.backend, result.task.queue_name) == ("second", "second")
        assert result.task.run_after == later
        assert_read_back_as_enqueued(second.get_result(result.id), result)
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result.id)

    get_queue("second").deliver_now([result.id for result in enqueued])
    work("second")

    assert sorted(tasks.calls) == [("add", (2, 3)), ("multiply", (6, 7))]
    assert sorted(started_tasks, key=lambda task: task.name) == [
        enqueued[1].task,
        enqueued[0].task,
    ]
    for result in enqueued:
        read = second.get_result(result.id)
        assert read.status == TaskResultStatus.SUCCESSFUL
        assert_read_back_as_enqueued(read, result)
        result.refresh()  # through result.task's backend, the second
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert [result.return_value for result in enqueued] == [42, 5]
    assert tasks.multiply.get_result(enqueued[0].id).task == enqueued[0].task


@pytest.mark.parametrize("name", INVALID_TASK_NAMES)
def test_the_invalid_task_error_is_found_under_either_of_its_names(name: str) -> None:
    exceptions = types.ModuleType("exceptions")
    error = type(name, (Exception,), {})
    setattr(exceptions, name, error)
    assert invalid_task_error(exceptions) is error

    with pytest.raises(ImproperlyConfigured, match="neither InvalidTask nor InvalidTaskError"):
        invalid_task_error(types.ModuleType("exceptions"))


def test_the_installed_frameworks_invalid_task_error_is_the_one_caught() -> None:
    framework = FRAMEWORK_BACKENDS.rpartition(".")[0]
    exceptions = importlib.import_module(f"{framework}.exceptions")
    assert InvalidTask is invalid_task_error(exceptions)
    assert InvalidTask.__name__ in INVALID_TASK_NAMES


@pytest.fixture(params=[pytest.param("cluster", marks=pytest.mark.cluster), "memory"])
def sharded_tasks_queue(request: pytest.FixtureRequest, settings: Any) -> Callable[..., Queue]:
    """``tasks_queue`` on a sharded queue: 6 shards on the Redis Cluster, 4 in memory."""
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        return partial(_tasks_configurer(cluster.url, settings), SHARDS=6)
    return partial(_tasks_configurer("memory://", settings), SHARDS=4)


def test_on_a_sharded_queue_each_result_lives_on_its_messages_shard(
    sharded_tasks_queue: Callable[..., Queue],
) -> None:
    queue = sharded_tasks_queue(RETRY_COUNT=1)
    results = [tasks.add.enqueue(n, b=1) for n in range(12)]
    failing = tasks.always_fails.enqueue("boom")
    stores = parts(queue.store)
    # Spread at random: 12 messages all on one shard of 4 would take a 1-in-4-million draw.
    assert len({shard_name(*shard_of(result.id)) for result in results}) > 1
    assert all(
        tasks.add.get_result(result.id).status == TaskResultStatus.READY for result in results
    )

    work()

    fresh = DelayQueueBackend("default", {"QUEUES": ["default"]})  # as in another process
    for n, result in enumerate(results):
        done = fresh.get_result(result.id)
        assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, n + 1)
    failed = fresh.get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in failed.errors] == [ValueError] * 2
    for result_id in [*(result.id for result in results), failing.id]:
        holding = [name for name, store in stores.items() if store.read_result(result_id)]
        assert holding == [shard_name(*shard_of(result_id))]
    assert queue.stats()["garbage"] == 1


def test_an_async_task_runs_on_the_workers_event_loop_with_its_signals(
    tasks_queue: Callable[..., Queue], received: list[Any]
) -> None:
    tasks_queue(RETRY_COUNT=0)
    on_loop = tasks.async_where.enqueue()
    failing = tasks.async_fails.enqueue()
    in_a_thread = tasks.add.enqueue(1, 2)
    received.clear()

    work()

    thread: Any = refreshed(on_loop).return_value
    assert thread == "delayqueue-event-loop"
    failed = refreshed(failing)
    assert failed.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in failed.errors] == [ValueError]
    assert refreshed(in_a_thread).return_value == 3
    # Each started and finished once, the async ones through asend.
    assert sorted(name for name, _, _ in received) == ["finished"] * 3 + ["started"] * 3
    assert ("finished", TaskResultStatus.FAILED, 1) in received


@pytest.mark.django_db(transaction=True)
def test_an_async_task_on_an_exactly_once_queue_runs_in_a_handler_thread(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    """Its transaction cannot hold an await: the task runs through async_to_sync, as before."""
    redis_tasks_queue(EXACTLY_ONCE=True)
    result = tasks.async_where.enqueue()
    work()
    result = refreshed(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    thread: Any = result.return_value
    assert thread != "delayqueue-event-loop"


def test_a_queue_of_sync_and_async_tasks_fetches_no_more_than_its_threads_can_start(
    redis_tasks_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One async task makes the queue's room count the loop's slots too; the sync tasks
    fetched into them would wait for the one handler thread, past the slack, and go back
    unstarted, batch after batch: every hand-back a round trip and a lease that kept the
    message from another worker."""
    queue = redis_tasks_queue()
    tasks.async_double.enqueue(1)
    napping = [tasks.naps.enqueue(0.05) for _ in range(40)]
    handed_back: list[str] = []
    release = Queue.release

    def counting_release(self: Queue, messages: Any) -> Any:
        handed_back.extend(message.id for message in messages)
        return release(self, messages)

    monkeypatch.setattr(Queue, "release", counting_release)

    call_command(
        "run_delayqueue", "default", burst=True, verbosity=0, concurrency=1, async_concurrency=100
    )

    assert all(refreshed(result).status == TaskResultStatus.SUCCESSFUL for result in napping)
    # (Batches fetched at the threads' pace hand back none, but for a busy machine's stall
    # now and then; counting the loop's 100 slots handed back about half of them.)
    assert len(handed_back) <= 3, f"{len(handed_back)} handed back"
    assert queue.stats()["pending"] == 0


def test_a_queue_of_async_tasks_runs_them_side_by_side_beside_one_thread(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    """The split of a fetch follows where the messages ran: async tasks fill the loop's
    slots, whatever the threads."""
    redis_tasks_queue()
    napping = [tasks.async_naps.enqueue(0.5) for _ in range(200)]
    started = time.monotonic()

    call_command(
        "run_delayqueue", "default", burst=True, verbosity=0, concurrency=1, async_concurrency=100
    )

    assert time.monotonic() - started < 6  # 200 one at a time would take 100 s
    assert all(refreshed(result).status == TaskResultStatus.SUCCESSFUL for result in napping)


def test_an_async_task_cancelled_at_its_time_limit_records_time_limit_exceeded(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    """The cancellation reaches the task as asyncio.CancelledError; its record must say
    what the attempt failed of, as the worker's verdict does: TimeLimitExceeded."""
    redis_tasks_queue(TIME_LIMIT=0.3, RETRY_COUNT=0)
    result = tasks.async_naps.enqueue(10)

    work()

    failed = refreshed(result)
    assert failed.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in failed.errors] == [TimeLimitExceeded]
    assert "TIME_LIMIT (0.3 s)" in failed.errors[0].traceback


def test_async_tasks_run_while_a_long_sync_task_holds_the_only_thread(
    redis_tasks_queue: Callable[..., Queue],
) -> None:
    """A full thread pool holds back the sync share of a fetch, not the async one: the loop
    goes on taking async tasks while the one thread naps."""
    redis_tasks_queue()
    first = [tasks.async_naps.enqueue(0.05) for _ in range(20)]
    napping = tasks.naps.enqueue(3)
    after: list[TaskResult[..., Any]] = []

    def enqueue_later() -> None:
        time.sleep(1)  # the sync task naps by now
        after.extend(tasks.async_naps.enqueue(0.1) for _ in range(50))

    later = threading.Thread(target=enqueue_later)
    later.start()
    call_command(
        "run_delayqueue", "default", burst=True, verbosity=0, concurrency=1, async_concurrency=100
    )
    later.join()
    assert len(after) == 50

    done = refreshed(napping).finished_at
    assert done is not None
    for result in [*first, *after]:
        finished = refreshed(result)
        assert finished.status == TaskResultStatus.SUCCESSFUL
        assert finished.finished_at is not None
        assert finished.finished_at < done
