"""``Message.group`` (issue #27): a handler, and the signals' messages, see the ordered group
a message was sent with, or None, keyed or not; run through the testing helpers (as the
worker runs handlers) and through ``Queue.fetch`` on Redis."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from delayqueue_django import get_queue, signals
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.testing import MemoryQueues, memory_queues
from tests.backends import REDIS_BACKENDS

HANDLED: list[Message] = []


def record(message: Message) -> None:
    HANDLED.append(message)


def refuse(message: Message) -> None:
    raise ConnectionError("down")


@pytest.fixture
def queues(settings: Any) -> Iterator[MemoryQueues]:
    settings.DELAYQUEUES = {
        "default": {"REDIS": "redis", "HANDLER": "tests.test_groups_message.record"},
        "failing": {
            "REDIS": "redis",
            "HANDLER": "tests.test_groups_message.refuse",
            "RETRY_COUNT": 0,
        },
    }
    HANDLED.clear()
    with memory_queues(start=datetime(2030, 1, 1, tzinfo=UTC)) as queues:
        yield queues


@pytest.fixture
def signalled() -> Iterator[list[tuple[str, str | None]]]:
    """(signal, the group on its message) for each signal sent."""
    seen: list[tuple[str, str | None]] = []

    def acked(*, message: Any, **kwargs: Any) -> None:
        seen.append(("acked", message.group))

    def nacked(*, message: Any, **kwargs: Any) -> None:
        seen.append(("nacked", message.group))

    def exhausted(*, message: Any, **kwargs: Any) -> None:
        seen.append(("exhausted", message.group))

    pairs = (
        (signals.message_acked, acked),
        (signals.message_nacked, nacked),
        (signals.message_exhausted, exhausted),
    )
    for signal, receiver in pairs:
        signal.connect(receiver)
    yield seen
    for signal, receiver in pairs:
        signal.disconnect(receiver)


def test_a_handler_sees_the_group_and_none_without_one(
    queues: MemoryQueues, signalled: list[tuple[str, str | None]]
) -> None:
    queue = get_queue()
    grouped = queue.send({"n": 1}, group="customer:42")
    keyed = queue.send({"n": 2}, key="order:7", group="customer:7")
    plain = queue.send({"n": 3})
    queues.run_due()
    seen = {message.id: (message.group, message.key) for message in HANDLED}
    assert seen == {
        grouped: ("customer:42", None),
        keyed: ("customer:7", "order:7"),
        plain: (None, None),
    }
    assert sorted(signalled, key=str) == sorted(
        [("acked", "customer:42"), ("acked", "customer:7"), ("acked", None)], key=str
    )


def test_the_exhausted_signal_carries_the_group(
    queues: MemoryQueues, signalled: list[tuple[str, str | None]]
) -> None:
    get_queue("failing").send("x", group="g")
    queues.run_due()
    assert signalled == [("nacked", "g"), ("exhausted", "g")]


@pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)
def test_queue_fetch_gives_each_message_its_group(queue: Queue) -> None:
    grouped = queue.send({"n": 1}, group="g")
    keyed = queue.send({"n": 2}, key="k", group="h")
    plain = queue.send({"n": 3})
    fetched = queue.fetch(10)
    assert {m.id: m.group for m in fetched.messages} == {grouped: "g", keyed: "h", plain: None}
    queue.ack(fetched.messages)
    # A dead letter keeps its group: its exhaustion's announcement carries it.
    queue.send("dead", group="g", retry_count=0)
    [message] = queue.fetch(10).messages
    queue.nack([message])
    [exhausted] = queue.claim_exhausted(10)
    assert (exhausted.id, exhausted.group) == (message.id, "g")


# The store's deliveries (Delivery.group), which Queue.fetch turns into messages.


@pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)
def test_a_delivery_carries_its_group(queue: Queue) -> None:
    store = queue.store
    grouped = NewMessage(uuid.uuid4().hex, "{}", 2, group="customer:7")
    ungrouped = NewMessage(uuid.uuid4().hex, "{}", 2)
    store.send([grouped, ungrouped])
    [sent] = store.send_keyed([NewMessage(uuid.uuid4().hex, "{}", 2, key="k", group="c:8")])
    groups = {d.id: d.group for d in store.fetch(10).deliveries}
    assert groups == {grouped.id: "customer:7", ungrouped.id: None, sent.id: "c:8"}


@pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)
def test_a_queue_without_groups_hands_out_no_group(queue: Queue) -> None:
    store = queue.store
    store.send([NewMessage(uuid.uuid4().hex, "{}", 2)])
    store.send_keyed([NewMessage(uuid.uuid4().hex, "{}", 2, key="k")])
    assert [d.group for d in store.fetch(10).deliveries] == [None, None]
