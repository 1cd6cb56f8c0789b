"""The Tasks backend's ``result.errors`` and the attempt records (issue #35): while its
message is stored a task's errors are its attempt records (one source of truth); when it
finishes the runner keeps a copy in the result, as the records go with the message. On
Redis and in memory."""

import uuid
from collections.abc import Callable

from delayqueue_django.core.queue import Queue
from delayqueue_django.tasks.compat import TaskResultStatus
from tests.task_app import tasks
from tests.test_tasks import _fresh_calls, refreshed, tasks_queue, work

__all__ = ["_fresh_calls", "tasks_queue"]  # the fixtures, shared with tests/test_tasks.py

SECRET = f"s3cr3t-{uuid.uuid4().hex}"


def test_a_retried_task_reads_its_errors_from_the_attempt_records(
    tasks_queue: Callable[..., Queue],
) -> None:
    queue = tasks_queue(RETRY_COUNT=2, NACK_REDELIVERY_DELAY=3600)
    result = tasks.always_fails.enqueue("boom")
    work()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    [record] = queue.history(result.id)
    assert (record.attempt, record.verdict, record.error) == (1, "error", "boom")
    assert [error.exception_class_path for error in result.errors] == ["builtins.ValueError"]
    assert result.errors[0].traceback == record.traceback
    assert "error:1" not in queue.store.read_result(result.id)  # no second copy meanwhile

    for _ in range(2):
        queue.deliver_now([result.id])
        work()
    assert refreshed(result).status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [ValueError] * 3
    # Kept in the result when the task finished: the dead letter and its records may go.
    assert queue.purge_garbage() == 1
    assert queue.history(result.id) == []
    result.refresh()
    assert [error.exception_class for error in result.errors] == [ValueError] * 3


def test_a_task_that_succeeds_after_failing_keeps_its_errors(
    tasks_queue: Callable[..., Queue],
) -> None:
    queue = tasks_queue(RETRY_COUNT=3)
    tasks.flaky_failures_left["n"] = 1
    result = tasks.flaky.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert queue.peek(result.id) is None  # acked: its records went with it
    assert len(result.errors) == 1


def test_history_redact_cleans_the_task_results_errors(
    tasks_queue: Callable[..., Queue],
) -> None:
    queue = tasks_queue(RETRY_COUNT=1, HISTORY_REDACT="tests.test_history_tasks.redact")
    result = tasks.always_fails.enqueue(f"token {SECRET}")
    work()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 2
    assert all(SECRET not in error.traceback for error in result.errors)
    assert all("token ***" in error.traceback for error in result.errors)
    kept = queue.store.read_result(result.id)
    assert all(SECRET not in value for name, value in kept.items() if name != "call")


def redact(message: object, error: BaseException) -> BaseException:
    return type(error)(str(error).replace(SECRET, "***")).with_traceback(error.__traceback__)
