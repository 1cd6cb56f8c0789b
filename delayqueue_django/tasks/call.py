"""What a task message carries, and the checks that keep a payload from running anything
that is not a task."""

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Keys of a task message's payload. The payload is all a worker needs: the result record
# in Redis is a view of the run, rebuilt from here if it has gone.
TASK_KEYS = frozenset({"task", "backend", "queue", "args", "kwargs", "enqueued_at", "run_after"})

DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


class MalformedTaskMessage(ValueError):
    """A message on a task queue that does not describe a task call."""


@dataclass(frozen=True, slots=True)
class TaskCall:
    """One enqueued call of a task: the task's import path and its arguments."""

    task_path: str
    backend: str
    queue_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    # ISO 8601 strings, as they travel in JSON (from_payload checks that they parse).
    enqueued_at: str
    run_after: str | None

    @property
    def enqueued_at_time(self) -> datetime:
        return datetime.fromisoformat(self.enqueued_at)

    @property
    def run_after_time(self) -> datetime | None:
        return None if self.run_after is None else datetime.fromisoformat(self.run_after)

    def to_payload(self) -> dict[str, Any]:
        return {
            "task": self.task_path,
            "backend": self.backend,
            "queue": self.queue_name,
            "args": self.args,
            "kwargs": self.kwargs,
            "enqueued_at": self.enqueued_at,
            "run_after": self.run_after,
        }

    @classmethod
    def from_payload(cls, payload: Any) -> "TaskCall":
        if not isinstance(payload, dict) or set(payload) != TASK_KEYS:
            raise MalformedTaskMessage(
                f"not a task message: expected a JSON object with the keys "
                f"{', '.join(sorted(TASK_KEYS))}"
            )
        path, backend, queue = payload["task"], payload["backend"], payload["queue"]
        if not isinstance(path, str) or not DOTTED_PATH.match(path):
            raise MalformedTaskMessage(f"task path {path!r} is not a dotted import path")
        for name, value in (("backend", backend), ("queue", queue)):
            if not isinstance(value, str) or not value:
                raise MalformedTaskMessage(f"{name} {value!r} is not a name")
        args, kwargs = payload["args"], payload["kwargs"]
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise MalformedTaskMessage("args must be a JSON array and kwargs a JSON object")
        enqueued_at, run_after = payload["enqueued_at"], payload["run_after"]
        if not _is_iso_datetime(enqueued_at):
            raise MalformedTaskMessage(
                f"enqueued_at {enqueued_at!r} is not an ISO 8601 date and time"
            )
        if run_after is not None and not _is_iso_datetime(run_after):
            raise MalformedTaskMessage(f"run_after {run_after!r} is not an ISO 8601 date and time")
        return cls(path, backend, queue, args, kwargs, enqueued_at, run_after)


def _is_iso_datetime(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True
