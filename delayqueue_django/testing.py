"""Helpers for your own tests: every queue on a fresh in-memory store whose clock you move,
what your code sent, and due messages run through their handlers in the test's own thread,
as the worker runs them (the same acks, retries, exhaustion and signals).

    from delayqueue_django.testing import memory_queues

    def test_an_unpaid_order_expires(client):
        with memory_queues() as queues:
            client.post("/orders/", {"item": "kettle"})
            [expiry] = queues.sent("orders")
            assert expiry.delay == timedelta(minutes=30)
            queues.advance(timedelta(minutes=30))
            queues.run_due()
        ...
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.test import override_settings

from delayqueue_django.core import conf, registry
from delayqueue_django.core.encoding import decode_payload
from delayqueue_django.core.handlers import Handler, is_async, loop_router, resolve
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.memory import ManualClock, MemoryServer, add_server, remove_server
from delayqueue_django.engine.records import split_trace
from delayqueue_django.outbox import table as outbox
from delayqueue_django.outbox.relay import OutboxRelay
from delayqueue_django.schedules.runner import ScheduleRunner
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.async_handling import acall_handler
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler

__all__ = ["MemoryQueues", "Outcome", "SentMessage", "Verdict", "memory_queues"]


@dataclass(frozen=True, slots=True)
class SentMessage:
    """A message as your code sent it."""

    id: str
    queue: str
    payload: Any
    """The payload as a handler will receive it (decoded JSON)."""
    due_at: datetime
    """When it is due (UTC, on the queues' clock)."""
    delay: timedelta
    """How long after it was sent it is due."""
    retry_count: int
    key: str | None = None
    """The key it was sent with, or None."""
    if_exists: str | None = None
    """What its send asked for if the key's message waited ("keep", "replace" or
    "error"); None when sent without a key."""


class MemoryQueues:
    """The queues of a ``memory_queues()`` block: what was sent, the clock, the handlers."""

    def __init__(self, server: MemoryServer, clock: ManualClock, *, schedules: bool) -> None:
        self._server = server
        self._clock = clock
        self._run_schedules = schedules
        # Each queue's schedules, run as a worker runs them (one worker's share).
        self._schedules: dict[Queue, ScheduleRunner] = {}

    @property
    def now(self) -> datetime:
        """The queues' clock: it stands still until ``advance`` moves it."""
        return _as_datetime(self._clock.now_ms())

    def advance(self, delta: float | timedelta) -> None:
        """Move the queues' clock forward by ``delta`` (seconds or a timedelta): messages,
        retries and redeliveries falling due by then become due."""
        self._clock.advance(delta)

    def sent(self, queue: str | None = None) -> list[SentMessage]:
        """Every message sent (to ``queue``, or to any) since the block began, in order,
        including those since cancelled or handled. Messages sent through the outbox count
        once their transaction committed: the rows of OUTBOX queues are relayed first.
        A keyed send is listed when it created a message, or replaced one (under the id
        it kept); a send the key kept or held back sent nothing and is not."""
        _relay_outbox()
        with self._server.lock:
            records = list(self._server.sent or ())
        return [
            SentMessage(
                id=record.message.id,
                queue=record.queue,
                payload=decode_payload(split_trace(record.message.payload)[1]),
                due_at=_as_datetime(record.due_ms),
                delay=timedelta(milliseconds=max(record.due_ms - record.sent_ms, 0)),
                retry_count=record.message.budget,
                key=record.message.key,
                if_exists=None if record.message.key is None else record.message.if_exists,
            )
            for record in records
            if queue is None or record.queue == queue
        ]

    def run_due(self, *queues: str) -> list[Outcome]:
        """Handle every message due now on these queues (default: all), in this thread, with
        the queues' handlers, until nothing is due; retries falling due meanwhile (a
        ``NACK_REDELIVERY_DELAY`` of 0) included. Verdicts are committed and signals sent as
        the worker does. Returns the outcomes in order (``.message``, ``.verdict``,
        ``.error``: a handler's exception is logged and kept there, as in the worker).
        An ``async def`` handler (or task) is awaited, as the worker awaits it on its loop;
        from an async test, use ``await queues.arun_due()``.

        With ``memory_queues(schedules=True)``, the queues' schedules are run first, as a
        worker runs them: the ticks due by now written (the settings' ones were stored when
        the block began; see the docs' Schedules guide), so a tick falls due as the clock
        reaches its time.
        Without it (the default) no worker-side tick is written: the settings' schedules
        never tick, and a schedule the test adds with ``queue.schedules.add()`` (which writes
        its first tick itself, as it does on Redis) runs that first tick only. So what a
        test counts is what it sent and added, whatever the clock.

        Database connections are left alone, as Django's test client leaves them for a
        request, so handlers see the test's transaction. The committed outbox rows of
        OUTBOX queues are relayed first, as the worker relays them.
        """
        _relay_outbox()
        outcomes: list[Outcome] = []
        while True:
            handled = len(outcomes)
            for queue, runner in self._due_queues(queues):
                fetched = _fetch(queue)
                handler = resolve(queue.config) if fetched else None
                for message in fetched:
                    assert handler is not None
                    outcome = _decline_or(runner, message)
                    if outcome is None:
                        awaited = _on_loop(handler, message)
                        if awaited is not None:
                            outcome = async_to_sync(_acall)(awaited, message, queue)
                        else:
                            outcome = _call(handler, message, queue)
                    outcomes.append(_committed(queue, outcome))
            if len(outcomes) == handled:
                return outcomes

    async def arun_due(self, *queues: str) -> list[Outcome]:
        """``run_due`` for an async test: ``async def`` handlers are awaited on the test's
        event loop, sync ones (and the verdicts' commits and signals) run through
        ``sync_to_async``, as they would from async code."""
        await sync_to_async(_relay_outbox)()
        outcomes: list[Outcome] = []
        while True:
            handled = len(outcomes)
            for queue, runner in await sync_to_async(self._due_queues)(queues):
                fetched = await sync_to_async(_fetch)(queue)
                handler = resolve(queue.config) if fetched else None
                for message in fetched:
                    assert handler is not None
                    outcome = await sync_to_async(_decline_or)(runner, message)
                    if outcome is None:
                        awaited = await sync_to_async(_on_loop)(handler, message)
                        if awaited is not None:
                            outcome = await _acall(awaited, message, queue)
                        else:
                            outcome = await sync_to_async(_call)(handler, message, queue)
                    outcomes.append(await sync_to_async(_committed)(queue, outcome))
            if len(outcomes) == handled:
                return outcomes

    def _due_queues(self, names: tuple[str, ...]) -> list[tuple[Queue, ScheduleRunner]]:
        """The queues named (default: all), each with its schedules, their due ticks written
        first with ``schedules=True``."""
        chosen = []
        for name in names or registry.queue_names():
            queue = registry.get_queue(name)
            runner = self._runner(queue)
            if self._run_schedules:
                runner.run_due(self._clock.now_ms())
            chosen.append((queue, runner))
        return chosen

    def _start_schedules(self) -> None:
        """Store every queue's settings schedules at the block's start, as a worker started
        then stores them: their first ticks count from the start, so a test that moves the
        clock before its first run_due() finds the ticks due by then."""
        for name in registry.queue_names():
            queue = registry.get_queue(name)
            self._runner(queue).run_due(self._clock.now_ms())

    def _runner(self, queue: Queue) -> ScheduleRunner:
        runner = self._schedules.get(queue)
        if runner is None:
            runner = self._schedules[queue] = ScheduleRunner(queue)
        return runner


def _relay_outbox() -> None:
    """Relay the outbox rows of the queues with OUTBOX, in this thread (so in the test's
    transaction, where a test's rows are); nothing, and no database access, without one."""
    queues = [registry.get_queue(name) for name in registry.queue_names()]
    outbox_queues = [queue for queue in queues if queue.config.outbox]
    if outbox_queues:
        OutboxRelay(outbox_queues).drain()


def _fetch(queue: Queue) -> list[Message]:
    fetched = queue.fetch()
    if fetched.exhaustions_owed:
        verdicts.announce_exhaustions(queue)
    return fetched.messages


def _decline_or(runner: ScheduleRunner, message: Message) -> Outcome | None:
    """An ack for a tick its schedule does not run (see ScheduleRunner.declines), or None."""
    return Outcome(message, Verdict.ACK) if runner.declines(message) else None


def _on_loop(handler: Handler, message: Message) -> Handler | None:
    """The async handler the worker would await for ``message``, or None: it runs ``handler``
    in a thread."""
    if is_async(handler):
        return handler
    router = loop_router(handler)
    return None if router is None else router(message)


def _call(handler: Handler, message: Message, queue: Queue) -> Outcome:
    return call_handler(
        handler, message, manage_connections=False, time_limit=queue.config.time_limit
    )


async def _acall(handler: Handler, message: Message, queue: Queue) -> Outcome:
    return await acall_handler(
        handler, message, manage_connections=False, time_limit=queue.config.time_limit
    )


def _committed(queue: Queue, outcome: Outcome) -> Outcome:
    if verdicts.commit(queue, outcome.verdict, [outcome]):
        verdicts.announce_exhaustions(queue)
    return outcome


def _as_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _on_memory(value: Any, url: str) -> Any:
    """``DELAYQUEUES`` with every queue moved to ``url``, its other options kept."""
    if not isinstance(value, Mapping):
        return value  # invalid: left for the usual error on use
    return {
        name: {
            **{key: option for key, option in options.items() if key not in _CONNECTION},
            "URL": url,
        }
        if isinstance(options, Mapping)
        else options
        for name, options in value.items()
    }


_CONNECTION = ("REDIS", "URL", "OPTIONS")


@contextmanager
def memory_queues(
    *, start: datetime | None = None, schedules: bool = False
) -> Iterator[MemoryQueues]:
    """Within the block, every queue in ``DELAYQUEUES`` keeps its options but lives on a
    fresh in-memory store of its own, whose clock starts at ``start`` (default: now) and
    stands still until moved with ``advance``. Nothing touches Redis.

    Schedules (the settings' ``SCHEDULES`` and ``queue.schedules.add``) tick only with
    ``schedules=True``: otherwise a settings schedule would add ticks to what a test
    counts, more or fewer by the time the test happens to run. Give ``start`` as well
    then, so that the ticks fall at the same times on every run."""
    clock = ManualClock(None if start is None else round(start.timestamp() * 1000))
    server = MemoryServer(f"testing-{token_hex(6)}", clock)
    server.sent = []
    add_server(server)
    try:
        with (
            override_settings(
                DELAYQUEUES=_on_memory(conf.raw_setting(), f"memory://{server.name}")
            ),
            outbox.clock(clock.now_us),
        ):
            queues = MemoryQueues(server, clock, schedules=schedules)
            if schedules:
                queues._start_schedules()
            yield queues
    finally:
        remove_server(server.name)
