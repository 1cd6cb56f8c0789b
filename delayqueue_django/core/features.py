"""Where the feature wings plug into the core, which imports none of them.

The core (settings, ``Queue``, handler resolution) has a few places where a feature takes
part: a send through the outbox, a Tasks queue's handler, a schedule naming a task, the
SCHEDULES option and ``Queue.schedules``. Each is a slot here, typed by what the core asks
of it; ``DelayQueueConfig.ready()`` (``apps.py``, the one module that knows every wing)
fills them when Django starts. A slot left empty says so when it is used: a project that
did not install the app has no wings plugged in.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from delayqueue_django.core.message import Message
from delayqueue_django.core.queue_schedules import QueueSchedules
from delayqueue_django.engine import NewMessage
from delayqueue_django.exceptions import QueueConfigurationError

NOT_PLUGGED_IN = (
    "the {feature} is not plugged in: delayqueue_django plugs its features in when Django "
    'starts (DelayQueueConfig.ready); add "delayqueue_django" to INSTALLED_APPS.'
)


class OutboxTable(Protocol):
    """What the core asks of the outbox: ``send(outbox=True)`` writes there, ``stats()``
    and the Tasks backend read what waits there (``delayqueue_django.outbox.table``)."""

    def write(self, queue_name: str, messages: Sequence[NewMessage], *, using: str | None) -> None:
        """Write prepared messages as outbox rows in the current transaction on ``using``."""

    def waiting(self, queue_name: str) -> dict[str, int]:
        """``outbox`` (rows waiting) and ``outbox_age_ms`` (the oldest one's wait)."""

    def payload_of(self, queue_name: str, message_id: str) -> str | None:
        """The payload of a message still waiting in the outbox, or None."""


_outbox: OutboxTable | None = None


def plug_outbox(table: OutboxTable) -> None:
    global _outbox
    _outbox = table


def outbox() -> OutboxTable:
    """The outbox plugged in; QueueConfigurationError if none is."""
    if _outbox is None:
        raise QueueConfigurationError(NOT_PLUGGED_IN.format(feature="outbox"))
    return _outbox


@dataclass(frozen=True)
class TaskCallSpec:
    """A call of a task, due at ``run_after``, that the core wants as a message of
    ``queue`` (a schedule's tick)."""

    task: str
    queue: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    enqueued_at: datetime
    run_after: datetime


class TaskMessages(Protocol):
    """What the core asks of the Tasks wing: a queue that carries tasks has their runner
    for handler, and a schedule may name a task (``delayqueue_django.tasks.plugin``)."""

    def handler_for(self, queue: str) -> Callable[[Message], Any] | None:
        """The handler of a queue that carries tasks; None for any other queue."""

    def call_payload(self, call: TaskCallSpec) -> Any | None:
        """The payload of a message that makes ``call``, or None if no task backend
        carries its queue."""

    def processed_before(self, message: Message) -> None:
        """A message acked without running its handler, as its EXACTLY_ONCE transaction
        committed before: if it is a task, its result says SUCCESSFUL."""


_tasks: TaskMessages | None = None


def plug_tasks(tasks: TaskMessages) -> None:
    global _tasks
    _tasks = tasks


def tasks() -> TaskMessages | None:
    """The Tasks wing, or None: then no queue carries tasks."""
    return _tasks


class Report(Protocol):
    """Says what is wrong with an option: a system check's id (``E040``), its message and
    a hint; the core raises or reports it as it does its own options' problems."""

    def __call__(self, check_id: str, msg: str, hint: str | None = None) -> None: ...


class QueueOptionReader(Protocol):
    """Reads a feature's option of one queue (``options`` holds them all, defaults filled
    in): what it returns is kept in ``QueueConfig.feature_options`` under the option's name
    for the feature to use; a problem is reported (and makes the queue's settings
    invalid), never raised."""

    def __call__(self, queue: str, options: Mapping[str, Any], report: Report, /) -> object: ...


_queue_options: dict[str, QueueOptionReader] = {}


def plug_queue_option(option: str, reader: QueueOptionReader) -> None:
    """Have ``reader`` read DELAYQUEUES' ``option`` (listed in core.conf.DEFAULTS) of every
    queue the settings are parsed for from now on."""
    _queue_options[option] = reader


def queue_options() -> Iterable[tuple[str, QueueOptionReader]]:
    return list(_queue_options.items())


class HandlerTransaction(Protocol):
    """What a handler that reports its own outcome (the Tasks runner) asks of the database
    transaction an EXACTLY_ONCE queue runs it in (``delayqueue_django.outbox.exactly_once``):
    an outcome recorded inside it must follow whether it commits."""

    def raise_if_rolled_back(self, message: Message) -> None:
        """Raise if the transaction the handler runs in will not commit."""

    def on_rollback(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(error)`` if that transaction ends without committing."""

    def on_commit(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once that transaction committed (at once outside one)."""

    def committed(self, queue: str, message_id: str) -> bool:
        """Whether the message's handler committed, as far as its queue can tell."""


class _AtLeastOnce:
    """No exactly-once wing: a handler runs in no transaction of the queue's, so nothing
    it reports can be undone, and whatever it returned from counts as committed."""

    def raise_if_rolled_back(self, message: Message) -> None:
        pass

    def on_rollback(self, callback: Callable[[BaseException], None]) -> None:
        pass

    def on_commit(self, callback: Callable[[], object]) -> None:
        callback()

    def committed(self, queue: str, message_id: str) -> bool:
        return True


_handler_transaction: HandlerTransaction = _AtLeastOnce()


def plug_handler_transaction(transaction: HandlerTransaction) -> None:
    global _handler_transaction
    _handler_transaction = transaction


def handler_transaction() -> HandlerTransaction:
    """The exactly-once wing's view of a handler's transaction (at least once without it)."""
    return _handler_transaction


# Queue.schedules: the schedules wing's view of a queue (it takes the Queue, which this
# module, imported by core.queue, cannot name).
_schedules: Callable[[Any], QueueSchedules] | None = None


def plug_schedules(view: Callable[[Any], QueueSchedules]) -> None:
    global _schedules
    _schedules = view


def schedules_of(queue: Any) -> QueueSchedules:
    """The schedules wing's view of ``queue`` (``schedules.api.Schedules``)."""
    if _schedules is None:
        raise QueueConfigurationError(NOT_PLUGGED_IN.format(feature="schedules API"))
    return _schedules(queue)
