"""The invariant checker: a healthy queue in every state passes, each kind of damage is named,
and the snapshot is consistent while producers and consumers are busy."""

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.invariants import InvariantReport
from tests.helpers import fetch_when_due


def one_in_each_state(configure: Callable[..., Queue]) -> tuple[Queue, dict[str, str]]:
    """A queue holding one message in each state, and the ids by state."""
    queue = configure(NACK_REDELIVERY_DELAY=0)
    ids = {
        "retry": queue.send("retry"),
        "garbage": queue.send("garbage", retry_count=0),
        "unack": queue.send("unack"),
    }
    delivered = {m.id: m for m in fetch_when_due(queue, count=3)}
    assert set(delivered) == set(ids.values())
    queue.nack([delivered[ids["retry"]], delivered[ids["garbage"]]])
    queue.fetch(0)  # the retry, due at once, is staged
    ids["ready"] = queue.send("ready")
    queue.fetch(0)
    ids["pending"] = queue.send("pending", delay=3600)
    return queue, ids


@pytest.fixture
def busy_queue(configure: Callable[..., Queue]) -> tuple[Queue, dict[str, str]]:
    return one_in_each_state(configure)


def kinds(queue: Queue) -> list[tuple[str, str]]:
    return sorted((problem.kind, problem.subject) for problem in queue.check_invariants().problems)


def test_a_healthy_queue_with_a_message_in_every_state_passes(
    busy_queue: tuple[Queue, dict[str, str]],
) -> None:
    queue, ids = busy_queue
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert report.counts == {"pending": 1, "ready": 1, "unack": 1, "retry": 1, "garbage": 1}
    assert report.messages == 5
    assert (report.damaged, report.quarantined) == (0, [])
    assert {state: queue.peek(i).state for state, i in ids.items()} == {  # type: ignore[union-attr]
        state: state for state in ids
    }


def test_an_empty_queue_passes(queue: Queue) -> None:
    report = queue.check_invariants()
    assert report.ok
    assert report.messages == 0


def test_each_broken_rule_is_named(redis_configure: Callable[..., Queue], raw: Any) -> None:
    queue, ids = one_in_each_state(redis_configure)
    key = queue.store.keys.key
    raw.zadd(key("pending"), {ids["garbage"]: 1})  # dead and pending at once
    raw.rpush(key("retry"), ids["retry"])  # twice in one list
    raw.hdel(key("payload"), ids["pending"])
    raw.hdel(key("meta"), ids["unack"])
    raw.hset(key("meta"), ids["ready"], "2:2:3")  # a redelivery cannot be in ready
    raw.hset(key("payload"), "lost-payload", '"x"')
    raw.hset(key("meta"), "lost-meta", "0:0:3")
    raw.zadd(key("exhausted"), {ids["retry"]: 1})
    assert kinds(queue) == sorted(
        [
            ("several-states", ids["garbage"]),
            ("several-states", ids["retry"]),
            ("no-payload", ids["pending"]),
            ("no-meta", ids["unack"]),
            ("wrong-attempt", ids["ready"]),
            ("orphan-payload", "lost-payload"),
            ("orphan-meta", "lost-meta"),
            ("unannounced-not-dead", ids["retry"]),
        ]
    )
    details = {str(problem) for problem in queue.check_invariants().problems}
    assert f"several-states: {ids['retry']}: found in retry x2" in details
    assert f"wrong-attempt: {ids['ready']}: attempt 2 with budget 3 cannot be ready" in details


def test_unreadable_meta_and_keys_of_the_wrong_type_are_named(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    message_id = queue.send("x")
    key = queue.store.keys.key
    raw.hset(key("meta"), message_id, "lease:attempt")
    raw.set(key("retry"), "not a list")
    assert kinds(queue) == [("bad-meta", message_id), ("wrong-type", key("retry"))]


def test_meta_fields_added_after_the_first_three_are_accepted(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    message_id = queue.send("x", delay=60)
    raw.hset(queue.store.keys.key("meta"), message_id, "0:0:3:1700000000000")
    assert queue.check_invariants().ok


def test_dead_letters_set_aside_as_damaged_are_counted_not_reported(
    redis_queue: Queue, raw: Any
) -> None:
    queue = redis_queue
    broken = queue.send("broken")
    raw.hdel(queue.store.keys.key("payload"), broken)
    queue.fetch(1)  # the engine moves it to garbage
    raw.set(queue.store.keys.key("unack"), "foreign")
    queue.fetch(1)  # ...and renames the foreign key aside
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert (report.counts["garbage"], report.damaged) == (1, 1)
    [renamed] = report.quarantined
    assert renamed.startswith(queue.store.keys.key("quarantine:unack:"))


def test_the_snapshot_is_consistent_while_the_queue_is_busy(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05, NACK_REDELIVERY_DELAY=0)
    stop = threading.Event()
    moves = 0

    def churn() -> None:
        nonlocal moves
        n = 0
        while not stop.is_set():
            # Each turn sends more than it settles: a cap keeps the queue, and so each O(n)
            # check, small (a fast store would otherwise outgrow the checks for good).
            if n < 3000:
                queue.send_many([{"n": n + i} for i in range(20)], delay=0.001 * (n % 7))
                n += 20
            fetched = queue.fetch(15).messages
            queue.ack(fetched[::3])
            queue.nack(fetched[1::3])
            queue.release(fetched[2::6])  # the rest time out in unack
            moves += len(fetched)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        reports: list[InvariantReport] = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline or len(reports) < 10:
            reports.append(queue.check_invariants())
    finally:
        stop.set()
        worker.join()
    assert moves > 100
    assert [r.problems for r in reports if not r.ok] == []
    assert len({r.messages for r in reports}) > 1  # the checks saw the queue change
