"""Outcome records (issue #35) on the memory store's clock: in ``memory_queues()`` the
clock stands still, so a record lasts exactly its retention as ``advance`` moves it, and an
hour's retention is tested without waiting an hour."""

from datetime import UTC, datetime, timedelta
from typing import Any

from delayqueue_django import get_queue
from delayqueue_django.engine.memory import MemoryStore
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.testing import memory_queues

START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_record_lasts_its_retention_on_the_manual_clock(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "memory://", "HISTORY_RETENTION": 3600}}
    with memory_queues(start=START) as queues:
        queue = get_queue()
        message_id = queue.send({"n": 1}, key="order:42")
        [message] = queue.fetch(1, fetcher="w:1:x").messages
        queue.ack([message], fetcher="w:1:x")
        queues.advance(timedelta(hours=1) - timedelta(milliseconds=1))
        record = queue.lookup("order:42")
        assert record is not None
        assert (record.id, record.state, record.ended_at) == (message_id, "acked", START)
        assert (record.worker, record.attempt) == ("w:1:x", 1)
        queues.advance(timedelta(milliseconds=1))
        assert queue.lookup("order:42") is None
        assert queue.message(message_id) is None


def test_records_past_their_retention_are_reclaimed_without_a_sweep(settings: Any) -> None:
    """As Redis expires the keys: the memory server forgets them on its next write or read,
    so they never pile up."""
    settings.DELAYQUEUES = {"default": {"URL": "memory://", "HISTORY_RETENTION": 60}}
    with memory_queues(start=START) as queues:
        queue = get_queue()
        for n in range(100):
            queue.cancel(queue.send({"n": n}, key=f"k{n}", delay=60))
        queues.advance(61)
        queue.cancel(queue.send({"n": "last"}, delay=60))
        store = parts(queue.store)["0"]
        assert isinstance(store, MemoryStore)
        state = store.server.state(store.keys.tag)
        assert (len(state.ended), len(state.ended_keys)) == (1, 0)
