"""What operators and the admin do: inspect, list, delete, requeue, deliver now, purge."""

import time
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from tests.helpers import fetch_when_due, states_of, store_time_ms


def bury_one(queue: Queue, payload: object = "dead") -> str:
    message_id = queue.send(payload, retry_count=0)
    [message] = [m for m in fetch_when_due(queue) if m.id == message_id]
    queue.nack([message])
    return message_id


def test_stats_counts_every_state_in_one_call(queue: Queue) -> None:
    queue.send("later", delay=60)
    bury_one(queue)
    queue.send("in flight")
    assert len(queue.fetch(1).messages) == 1
    queue.send("retrying")
    [retrying] = queue.fetch(1).messages
    queue.nack([retrying], delay=0)
    queue.send("staged")
    queue.fetch(0)
    queue.send("due but unstaged")

    stats = queue.stats()
    counts = {s: stats[s] for s in ("pending", "ready", "unack", "retry", "garbage")}
    assert counts == {"pending": 2, "ready": 1, "unack": 1, "retry": 1, "garbage": 1}
    assert stats["due"] == 1
    assert stats["unannounced"] == 1
    assert stats["next_due_ms"] <= stats["server_time_ms"]
    assert stats["lag_ms"] >= 0
    assert abs(stats["server_time_ms"] - store_time_ms(queue)) < 1000


def test_stats_of_an_empty_queue(queue: Queue) -> None:
    stats = queue.stats()
    assert stats["next_due_ms"] == -1
    assert stats["lag_ms"] == 0
    assert {k: v for k, v in stats.items() if k not in ("server_time_ms", "next_due_ms")} == {
        "pending": 0,
        "ready": 0,
        "unack": 0,
        "retry": 0,
        "garbage": 0,
        "due": 0,
        "unannounced": 0,
        "lag_ms": 0,
        "acked_total": 0,
        "failed_total": 0,
        "retried_total": 0,
        "timed_out_total": 0,
        "exhausted_total": 0,
        "superseded_total": 0,
        "paused": 0,
        "expired_total": 0,
        "postponed_total": 0,
        "shards_down": 0,
    }


def test_lag_measures_how_long_the_oldest_due_message_has_waited(queue: Queue) -> None:
    queue.send("x")
    time.sleep(0.05)
    assert queue.stats()["lag_ms"] >= 50


@pytest.mark.parametrize("where", ["ready", "retry", "handed back"])
def test_lag_counts_due_messages_already_staged(queue: Queue, where: str) -> None:
    # Issue #33: lag counted only pending, so a message a fetch had staged (in ready or
    # retry), or a worker had handed back, showed lag 0 however long it waited there.
    queue.send("waiting")
    if where == "retry":
        [message] = fetch_when_due(queue)
        queue.nack([message], delay=0)
    elif where == "handed back":
        [message] = fetch_when_due(queue)
        queue.release([message])
    queue.fetch(0)  # stages what is due, hands nothing out
    time.sleep(0.2)
    stats = queue.stats()
    place = "ready" if where == "handed back" else where
    assert (stats["pending"], stats[place]) == (0, 1)
    assert 200 <= stats["lag_ms"] < 5000


def test_lag_is_the_longest_wait_of_pending_and_staged_messages(queue: Queue) -> None:
    queue.send("first")
    time.sleep(0.2)
    queue.fetch(0)  # "first" waits in ready
    queue.send("second")
    time.sleep(0.1)
    stats = queue.stats()
    assert (stats["pending"], stats["ready"]) == (1, 1)
    assert stats["lag_ms"] >= 300


def test_list_pages_through_a_state_in_due_order(queue: Queue) -> None:
    ids = [queue.send(i, delay=100 + i) for i in range(25)]
    page1 = queue.list_messages("pending", offset=0, limit=10)
    page3 = queue.list_messages("pending", offset=20, limit=10)
    assert [m.id for m in page1] == ids[:10]
    assert [m.id for m in page3] == ids[20:]
    first = page1[0]
    assert (first.state, first.payload, first.attempt, first.budget) == ("pending", "0", 0, 3)
    assert first.retries_left == 3
    assert queue.list_messages("pending", offset=30, limit=10) == []


def test_list_cuts_long_payloads_on_a_character_boundary(queue: Queue) -> None:
    message_id = queue.send("é" * 100)
    [entry] = queue.list_messages("pending", preview_bytes=10)
    assert entry.id == message_id
    assert entry.payload is not None
    assert entry.payload.startswith('"é')
    assert len(entry.payload.encode()) <= 10
    assert entry.payload_size == len(('"' + "é" * 100 + '"').encode())


def test_peek_cuts_a_long_payload_on_a_character_boundary_when_asked(queue: Queue) -> None:
    message_id = queue.send("é" * 100)
    whole = queue.peek(message_id)
    assert whole is not None
    assert whole.payload == '"' + "é" * 100 + '"'
    # 10 bytes end inside the fifth character: it is left out, not split.
    cut = queue.peek(message_id, preview_bytes=10)
    assert cut is not None
    assert cut.payload == '"' + "é" * 4
    assert cut.payload_size == whole.payload_size == 202
    assert queue.peek(message_id, preview_bytes=202) == whole
    assert queue.peek(message_id, preview_bytes=0).payload == ""  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="preview_bytes"):
        queue.peek(message_id, preview_bytes=-1)


def test_peek_payload_gives_the_bytes_stored_on_every_store(queue: Queue) -> None:
    message_id = queue.send({"text": "é€😀", "n": [1, None]}, delay=60)
    assert queue.peek_payload(message_id) == '{"text":"é€😀","n":[1,null]}'.encode()
    assert queue.peek(message_id) is not None  # nothing moved
    assert queue.peek_payload("nope") is None
    with pytest.raises(TypeError, match="message id"):
        queue.peek_payload("")


def test_list_rejects_unknown_states_and_bad_ranges(queue: Queue) -> None:
    with pytest.raises(ValueError, match="unknown state 'done'"):
        queue.list_messages("done")
    with pytest.raises(ValueError, match="offset"):
        queue.list_messages("pending", offset=-1)
    with pytest.raises(ValueError, match="limit"):
        queue.list_messages("pending", limit=5000)


@pytest.mark.parametrize("state", ["pending", "ready", "unack", "retry", "garbage"])
def test_list_and_peek_show_each_state(queue: Queue, state: str) -> None:
    if state == "garbage":
        message_id = bury_one(queue, {"p": 1})
    else:
        message_id = queue.send({"p": 1}, delay=60 if state == "pending" else 0)
    if state == "ready":
        queue.fetch(0)
    if state in ("unack", "retry"):
        [message] = fetch_when_due(queue)
    if state == "retry":
        queue.nack([message], delay=0)
        queue.fetch(0)

    [listed] = queue.list_messages(state)
    peeked = queue.peek(message_id)
    assert listed.id == message_id
    assert peeked is not None
    assert peeked.state == listed.state == state
    assert peeked.payload == listed.payload == '{"p":1}'
    assert (peeked.score_ms is None) == (state in ("ready", "retry"))


def test_delete_removes_a_message_from_any_state(queue: Queue) -> None:
    dead = bury_one(queue)
    in_flight = queue.send("x")
    fetch_when_due(queue)
    later = queue.send("y", delay=60)

    assert queue.delete(dead) == "garbage"
    assert queue.delete(in_flight) == "unack"
    assert queue.delete(later) == "pending"
    assert queue.delete(later) is None
    for message_id in (dead, in_flight, later):
        assert states_of(queue, message_id) == []
        assert queue.peek(message_id) is None
    assert queue.stats()["unannounced"] == 0


def test_delete_from_a_state_leaves_a_message_that_has_moved_on(queue: Queue) -> None:
    # (The admin deletes from the state the operator saw a message in.)
    dead = bury_one(queue)
    assert queue.delete(dead, state="pending") is None
    queue.requeue([dead])
    fetch_when_due(queue)
    assert queue.delete(dead, state="garbage") is None
    assert states_of(queue, dead) == ["unack"]
    assert queue.delete(dead, state="unack") == "unack"
    assert queue.peek(dead) is None
    with pytest.raises(ValueError, match="state must be one of"):
        queue.delete(dead, state="lost")


def test_requeue_gives_a_dead_letter_a_fresh_retry_budget(queue: Queue) -> None:
    message_id = queue.send("again", retry_count=1)
    for _ in range(2):
        [message] = fetch_when_due(queue)
        queue.nack([message], delay=0)
    assert states_of(queue, message_id) == ["garbage"]

    assert queue.requeue([message_id, "unknown"]) == [message_id]
    assert states_of(queue, message_id) == ["pending"]
    assert queue.stats()["unannounced"] == 0
    [message] = fetch_when_due(queue)
    assert (message.id, message.attempt, message.retries_left) == (message_id, 1, 1)
    assert queue.requeue([message_id]) == []  # in flight now, not garbage


def test_requeue_refuses_a_dead_letter_whose_payload_is_gone(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    message_id = bury_one(queue)
    raw.hdel(queue.store.keys.key("payload"), message_id)
    assert queue.requeue([message_id]) == []
    assert states_of(queue, message_id) == ["garbage"]


def test_deliver_now_makes_a_pending_message_due(queue: Queue) -> None:
    message_id = queue.send("later", delay=3600)
    other = queue.send("other", delay=3600)
    assert queue.deliver_now([message_id, "unknown"]) == [message_id]
    [message] = fetch_when_due(queue)
    assert message.id == message_id
    assert states_of(queue, other) == ["pending"]


def test_purge_garbage_deletes_every_dead_letter(configure: Callable[..., Queue]) -> None:
    queue = configure(RETRY_COUNT=0)
    ids = queue.send_many(range(2500))
    while fetched := queue.fetch(1000).messages:
        queue.nack(fetched)
    assert queue.stats()["garbage"] == 2500

    assert queue.purge_garbage() == 2500
    stats = queue.stats()
    assert (stats["garbage"], stats["unannounced"]) == (0, 0)
    # Payloads and meta records go too: peek finds nothing at all (a sample of ids).
    assert [queue.peek(message_id) for message_id in ids[::50]] == [None] * 50


def test_purge_garbage_buried_before_a_time_keeps_later_burials(queue: Queue) -> None:
    # (The admin's purge: those buried before its confirmation page read the count.)
    seen = bury_one(queue)
    time.sleep(0.005)
    shown_at = queue.stats()["server_time_ms"]
    later = bury_one(queue)
    assert queue.purge_garbage(buried_before_ms=shown_at) == 1
    assert queue.peek(seen) is None
    assert states_of(queue, later) == ["garbage"]


def test_retention_expires_only_announced_dead_letters_past_their_time(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(GARBAGE_RETENTION=0.05)
    announced, unannounced = bury_one(queue), bury_one(queue)
    queue.confirm_exhausted([c for c in queue.claim_exhausted(10) if c.id == announced])
    assert queue.expire_garbage() == 0  # not old enough yet

    time.sleep(0.06)
    assert queue.expire_garbage() == 1
    assert queue.peek(announced) is None
    assert states_of(queue, unannounced) == ["garbage"]


def test_retention_reaches_announced_dead_letters_behind_whole_batches_of_unannounced_ones(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayqueue_django.core.queue import operating

    monkeypatch.setattr(operating, "GARBAGE_DROP_BATCH", 2)  # each script call examines 2
    queue = configure(GARBAGE_RETENTION=0.05)
    unannounced = {bury_one(queue) for _ in range(3)}  # the oldest: more than a whole call
    time.sleep(0.005)
    announced = {bury_one(queue) for _ in range(3)}
    claims = queue.claim_exhausted(10)
    queue.confirm_exhausted([claim for claim in claims if claim.id in announced])

    time.sleep(0.06)
    assert queue.expire_garbage() == 3
    assert {m.id for m in queue.list_messages("garbage")} == unannounced
    assert queue.stats()["unannounced"] == 3


def test_retention_none_keeps_dead_letters(configure: Callable[..., Queue]) -> None:
    queue = configure(GARBAGE_RETENTION=None)
    message_id = bury_one(queue)
    queue.confirm_exhausted(queue.claim_exhausted(10))
    assert queue.expire_garbage() == 0
    assert states_of(queue, message_id) == ["garbage"]


def test_throughput_counts_acks_and_failures_per_minute(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.01)
    queue.send_many(range(5))
    fetched = queue.fetch(5).messages
    queue.ack(fetched[:3])
    queue.nack(fetched[3:4], delay=60)
    queue.bury(fetched[4:])
    queue.ack(fetched[:3])  # stale duplicates do not count
    queue.send("times out")
    fetch_when_due(queue)
    time.sleep(0.03)
    queue.fetch(0)  # the expired delivery counts as failed

    counts = queue.throughput(2)
    assert len(counts) == 2
    minute_start, acked, failed = counts[-1]
    if (acked, failed) == (0, 0):  # the minute turned over between the two calls
        minute_start, acked, failed = counts[-2]
    assert (acked, failed) == (3, 3)
    assert minute_start % 60_000 == 0
    assert counts[0][0] + 60_000 == counts[1][0]


def test_throughput_refuses_minutes_out_of_range(queue: Queue) -> None:
    with pytest.raises(ValueError, match="minutes must be"):
        queue.throughput(0)


def test_held_names_the_messages_the_queue_still_holds_in_any_state(queue: Queue) -> None:
    later = queue.send("later", delay=60)
    dead = bury_one(queue)
    taken = queue.send("in flight")
    [message] = [m for m in fetch_when_due(queue) if m.id == taken]
    acked = queue.send("acked")
    [done] = [m for m in fetch_when_due(queue) if m.id == acked]
    queue.ack([done])
    removed = queue.send("removed", delay=60)
    queue.cancel(removed)

    asked = [later, dead, taken, acked, removed, "never-sent"]
    assert queue.held(asked) == {later, dead, taken}
    assert queue.held([]) == set()
    queue.ack([message])
    assert queue.held(asked) == {later, dead}
