"""The message life cycle, on a single Redis, a Redis Cluster and the memory store (the
``queue`` fixture); a few tests about Redis itself use ``redis_queue``."""

import time
from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from tests.helpers import fetch_when_due, redis_store, states_of, store_time_ms, wait_for


def test_message_waits_until_due_then_is_delivered_once_and_forgotten_on_ack(queue: Queue) -> None:
    message_id = queue.send({"order": 42}, delay=0.2)

    early = queue.fetch()
    assert early.messages == []
    assert early.next_ms is not None
    assert early.next_ms > early.now_ms

    [message] = fetch_when_due(queue)
    assert (message.id, message.payload, message.attempt) == (message_id, {"order": 42}, 1)
    assert message.queue == "default"
    assert states_of(queue, message_id) == ["unack"]
    assert queue.fetch().messages == []

    assert queue.ack([message]) == {message_id}
    assert states_of(queue, message_id) == []
    assert queue.peek(message_id) is None
    stats = queue.stats()
    assert [stats[s] for s in ("pending", "ready", "unack", "retry", "garbage")] == [0] * 5


def test_due_time_is_counted_from_the_store_clock_in_milliseconds(queue: Queue) -> None:
    before = store_time_ms(queue)
    message_id = queue.send("x", delay=90.5)
    after = store_time_ms(queue)
    [entry] = queue.list_messages("pending")
    assert entry.id == message_id
    assert entry.score_ms is not None
    # Rounded up to the ms from the µs the store read its clock at, never down.
    assert before + 90_500 <= entry.score_ms <= after + 90_501


def test_nack_schedules_retries_with_the_configured_backoff_then_buries(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(NACK_REDELIVERY_DELAY=[0.05, 0.1], RETRY_COUNT=2)
    message_id = queue.send({"n": 1})

    attempts = []
    for expected_delay in (50, 100):
        [message] = fetch_when_due(queue)
        attempts.append(message.attempt)
        [outcome] = queue.nack([message])
        assert not outcome.exhausted
        # The retry is due the delay after the nack, rounded up to the ms.
        assert outcome.at_ms - store_time_ms(queue) <= expected_delay + 1
        assert states_of(queue, message_id) == ["pending"]
    [message] = fetch_when_due(queue)
    attempts.append(message.attempt)
    assert message.is_last_attempt
    assert message.retries_left == 0

    [outcome] = queue.nack([message])
    assert outcome.exhausted
    assert attempts == [1, 2, 3]
    assert states_of(queue, message_id) == ["garbage"]
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"
    assert stored.unannounced
    assert stored.payload == '{"n":1}'
    assert queue.stats()["unannounced"] == 1


def test_retry_count_zero_buries_on_first_failure(queue: Queue) -> None:
    message_id = queue.send("once", retry_count=0)
    [message] = fetch_when_due(queue)
    assert message.retry_count == 0
    assert message.is_last_attempt
    [outcome] = queue.nack([message])
    assert outcome.exhausted
    assert states_of(queue, message_id) == ["garbage"]


def test_unacked_delivery_is_redelivered_after_its_deadline_using_one_retry(
    configure: Callable[..., Queue],
) -> None:
    # A lease a loaded machine cannot outlast between two calls in a row (0.1 s, it once
    # did: the second fetch came after the deadline and got the message back).
    queue = configure(MAX_CONSUME_DURATION=1)
    message_id = queue.send("slow")
    [first] = fetch_when_due(queue)
    before_deadline = queue.fetch()
    assert store_time_ms(queue) < first.deadline_ms  # so the fetch above was before it
    assert before_deadline.messages == []
    assert before_deadline.next_ms == first.deadline_ms

    [second] = fetch_when_due(queue)
    assert second.id == message_id
    assert second.attempt == 2
    assert second.lease != first.lease


def test_a_last_attempt_that_times_out_is_buried_and_its_exhaustion_owed(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05, RETRY_COUNT=0)
    message_id = queue.send({"k": 1})
    [message] = fetch_when_due(queue)
    time.sleep(0.1)
    result = queue.fetch(0)
    assert (result.expired, result.exhaustions_owed) == (1, True)
    assert states_of(queue, message_id) == ["garbage"]
    [claim] = queue.claim_exhausted(10)
    assert (claim.id, claim.payload, claim.attempt) == (message_id, {"k": 1}, 1)
    assert queue.ack([message]) == set()  # too late: the delivery is dead
    assert sum(failed for _, _, failed in queue.throughput(2)) == 1


def test_late_ack_from_a_timed_out_delivery_does_not_touch_the_new_one(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.1)
    message_id = queue.send("slow")
    [first] = fetch_when_due(queue)
    [second] = fetch_when_due(queue)  # after the deadline: redelivered
    assert second.attempt == 2

    assert queue.ack([first]) == set()
    assert queue.nack([first]) == []
    assert queue.release([first]) == []
    assert queue.extend([first])[1] == []
    assert states_of(queue, message_id) == ["unack"]
    assert queue.peek(message_id) is not None

    assert queue.ack([second]) == {message_id}
    assert states_of(queue, message_id) == []


@pytest.mark.parametrize(
    "route", ["timed out", "timed out, buried", "nacked", "nacked, buried", "released"]
)
def test_an_ack_whose_delivery_left_unack_changes_nothing_wherever_it_went(
    configure: Callable[..., Queue], route: str
) -> None:
    # The ack tells a delivery still in flight by its meta record's lease alone (issue #34):
    # each way out of unack must leave a lease that no longer holds, before any redelivery.
    buried = route.endswith("buried")
    queue = configure(MAX_CONSUME_DURATION=0.05, RETRY_COUNT=0 if buried else 3)
    message_id = queue.send("x")
    [message] = fetch_when_due(queue)
    if route.startswith("timed out"):
        time.sleep(0.1)
        queue.fetch(0)  # housekeeping only: the delivery leaves unack, not handed out again
    elif route.startswith("nacked"):
        queue.nack([message], delay=60)
    else:
        queue.release([message])
    where = states_of(queue, message_id)
    assert where == [
        {"timed out": "retry", "nacked": "pending", "released": "ready"}.get(route, "garbage")
    ]
    assert queue.ack([message]) == set()
    assert queue.ack([message], fetcher="w", request="1") == set()
    assert states_of(queue, message_id) == where
    assert queue.peek(message_id) is not None
    assert queue.stats()["acked_total"] == 0
    report = queue.check_invariants()
    assert report.ok, report.problems


def test_late_nack_after_timeout_does_not_put_a_second_copy_into_retry(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.05)
    message_id = queue.send("slow")
    [first] = fetch_when_due(queue)
    time.sleep(0.1)
    queue.fetch(0)  # housekeeping only: the expired delivery moves to retry
    assert states_of(queue, message_id) == ["retry"]

    assert queue.nack([first], delay=0) == []
    assert states_of(queue, message_id) == ["retry"]


def test_duplicate_ack_and_nack_after_ack_are_harmless(queue: Queue) -> None:
    message_id = queue.send("x")
    [message] = fetch_when_due(queue)
    assert queue.ack([message]) == {message_id}
    assert queue.ack([message]) == set()
    assert queue.nack([message]) == []
    assert states_of(queue, message_id) == []


def test_a_batch_naming_a_delivery_twice_counts_it_once(queue: Queue) -> None:
    first_id, second_id = queue.send_many(["a", "b"])
    fetched = {m.id: m for m in fetch_when_due(queue, count=2)}
    first, second = fetched[first_id], fetched[second_id]
    assert queue.ack([first, first]) == {first_id}
    assert queue.stats()["acked_total"] == 1

    outcomes = queue.nack([second, second], delay=60)
    assert [(o.id, o.exhausted) for o in outcomes] == [(second_id, False)]
    stats = queue.stats()
    assert (stats["failed_total"], stats["retried_total"], stats["pending"]) == (1, 1, 1)


def test_ack_after_nack_of_the_same_delivery_is_ignored(queue: Queue) -> None:
    message_id = queue.send("x")
    [message] = fetch_when_due(queue)
    queue.nack([message], delay=60)
    assert queue.ack([message]) == set()
    assert states_of(queue, message_id) == ["pending"]
    assert queue.peek(message_id) is not None


def test_release_hands_back_without_using_a_retry_and_keeps_order(queue: Queue) -> None:
    ids = queue.send_many(["a", "b", "c"])
    fetched = fetch_when_due(queue, count=3)
    assert sorted(m.id for m in fetched) == sorted(ids)

    assert queue.release(fetched) == [m.id for m in fetched]
    again = queue.fetch(3).messages
    assert [m.id for m in again] == [m.id for m in fetched]
    assert [m.attempt for m in again] == [1, 1, 1]


def test_released_retry_keeps_its_attempt_number(queue: Queue) -> None:
    queue.send("x")
    [message] = fetch_when_due(queue)
    queue.nack([message], delay=0)
    [retry] = fetch_when_due(queue)
    assert retry.attempt == 2
    queue.release([retry])
    [again] = queue.fetch().messages
    assert again.attempt == 2


def test_extend_pushes_the_deadline(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_CONSUME_DURATION=60)
    message_id = queue.send("long")
    [message] = fetch_when_due(queue)
    deadline, extended = queue.extend([message])
    assert extended == [message_id]
    assert deadline >= message.deadline_ms
    stored = queue.peek(message_id)
    assert stored is not None
    assert (stored.state, stored.score_ms) == ("unack", deadline)


def test_exhaustion_is_claimed_and_confirmed(queue: Queue) -> None:
    message_id = queue.send({"k": "v"}, retry_count=0)
    [message] = fetch_when_due(queue)
    queue.nack([message])

    [claim] = queue.claim_exhausted(10, claim_seconds=60)
    assert (claim.id, claim.payload, claim.attempt, claim.queue) == (
        message_id,
        {"k": "v"},
        1,
        "default",
    )
    assert queue.claim_exhausted(10) == []  # claimed: nobody else announces it meanwhile
    assert queue.confirm_exhausted([claim]) == 1
    assert queue.stats()["unannounced"] == 0
    assert states_of(queue, message_id) == ["garbage"]


def test_unconfirmed_exhaustion_claim_is_claimed_again_after_it_lapses(queue: Queue) -> None:
    queue.send("x", retry_count=0)
    [message] = fetch_when_due(queue)
    queue.nack([message])
    [claim] = queue.claim_exhausted(10, claim_seconds=0.05)
    [again] = wait_for(lambda: queue.claim_exhausted(10), what="the claim to lapse")
    assert again.id == claim.id
    # The first claimant confirms late: that leaves the second claim to its own confirm.
    assert queue.confirm_exhausted([claim]) == 0
    assert queue.stats()["unannounced"] == 1
    assert queue.confirm_exhausted([again, again]) == 1
    assert queue.stats()["unannounced"] == 0


def test_a_late_confirm_leaves_a_newer_exhaustion_of_the_same_message_owed(queue: Queue) -> None:
    message_id = queue.send("x", retry_count=0)
    [message] = fetch_when_due(queue)
    queue.nack([message])
    [claim] = queue.claim_exhausted(10, claim_seconds=60)
    # While its announcer is busy, the dead letter is requeued, delivered and buried again.
    assert queue.requeue([message_id]) == [message_id]
    [again] = fetch_when_due(queue)
    [outcome] = queue.bury([again])
    assert outcome.exhausted

    assert queue.confirm_exhausted([claim]) == 0  # not the claim it made
    assert queue.stats()["unannounced"] == 1
    [newer] = queue.claim_exhausted(10)
    assert (newer.id, newer.attempt) == (message_id, 1)
    assert queue.confirm_exhausted([newer]) == 1
    assert queue.stats()["unannounced"] == 0


def test_confirm_exhausted_takes_claims_not_ids(queue: Queue) -> None:
    with pytest.raises(TypeError, match="the claims claim_exhausted returned"):
        queue.confirm_exhausted(["some-id"])  # type: ignore[list-item]


def test_bury_skips_the_remaining_retries(queue: Queue) -> None:
    message_id = queue.send("poison", retry_count=5)
    [message] = fetch_when_due(queue)
    [outcome] = queue.bury([message])
    assert outcome.exhausted
    assert states_of(queue, message_id) == ["garbage"]


def test_no_key_of_the_queue_ever_has_a_ttl(redis_queue: Queue, raw: Any) -> None:
    queue = redis_queue
    queue.send("months away", delay=90 * 24 * 3600)
    queue.send("retrying")
    [message] = fetch_when_due(queue)
    queue.nack([message], delay=30 * 24 * 3600)
    queue.send("dead", retry_count=0)
    [dead] = fetch_when_due(queue)
    queue.nack([dead])
    for key in queue.store.keys.layout:
        assert raw.ttl(key) in (-1, -2), key
    assert raw.ttl(queue.store.keys.key("payload")) == -1


BUDGETS = [0, 3, 25, 26, 1000]


def test_a_pending_message_has_no_meta_record_until_it_is_handed_out(
    redis_queue: Queue, raw: Any
) -> None:
    # About Redis: the memory layout. The budget and due time travel with the payload (in a
    # prefix "~<budget>~<due>~"), staged or not.
    queue = redis_queue
    ids = {budget: queue.send({"budget": budget}, retry_count=budget) for budget in BUDGETS}
    sent = {message_id: queue.peek(message_id) for message_id in ids.values()}
    for state in ("pending", "ready"):
        if state == "ready":
            wait_for(lambda: queue.stats()["due"] == len(BUDGETS), what="all due")
            queue.fetch(0)
        assert raw.exists(queue.store.keys.key("meta")) == 0
        listed = {entry.id: entry for entry in queue.list_messages(state)}
        for budget, message_id in ids.items():
            peeked = queue.peek(message_id)
            assert peeked is not None
            assert (peeked.state, peeked.lease, peeked.attempt) == (state, 0, 0)
            assert peeked.budget == budget
            assert peeked.payload == f'{{"budget":{budget}}}'
            assert peeked.payload_size == len(peeked.payload)
            assert listed[message_id].payload == peeked.payload
            assert listed[message_id].budget == budget
        assert queue.check_invariants().ok

    delivered = {m.id: m for m in fetch_when_due(queue, count=10)}
    assert {m.payload["budget"]: m.retry_count for m in delivered.values()} == {
        budget: budget for budget in BUDGETS
    }
    assert {m.id: m.due_ms for m in delivered.values()} == {
        message_id: stored.score_ms  # type: ignore[union-attr]
        for message_id, stored in sent.items()
    }
    assert raw.hlen(queue.store.keys.key("meta")) == len(BUDGETS)


def test_messages_a_previous_release_stored_are_delivered(redis_queue: Queue, raw: Any) -> None:
    # Before pending messages went without a meta record: every message had one, and its
    # payload was stored bare.
    queue = redis_queue
    key = queue.store.keys.key
    now = store_time_ms(queue)
    raw.zadd(key("pending"), {"old-pending": now - 5, "old-retry": now - 4})
    raw.rpush(key("ready"), "old-ready")
    for message_id in ("old-pending", "old-retry", "old-ready"):
        raw.hset(key("payload"), message_id, f'"{message_id}"')
    raw.hset(key("meta"), "old-pending", f"0:0:5:{now - 5}")
    raw.hset(key("meta"), "old-retry", f"3:1:5:{now - 4}")
    raw.hset(key("meta"), "old-ready", f"0:0:7:{now - 6}")
    assert queue.check_invariants().ok
    peeked = queue.peek("old-pending")
    assert peeked is not None
    assert (peeked.payload, peeked.budget) == ('"old-pending"', 5)
    # A send repeated (its reply lost) by a client of the previous release is a replay.
    assert queue.store.send([NewMessage(id="old-pending", payload='"old-pending"', budget=5)]) == [
        now - 5
    ]

    delivered = {m.id: m for m in fetch_when_due(queue, count=10)}
    assert {m.id: (m.payload, m.attempt, m.retry_count, m.due_ms) for m in delivered.values()} == {
        "old-retry": ("old-retry", 2, 5, now - 4),
        "old-ready": ("old-ready", 1, 7, now - 6),
        "old-pending": ("old-pending", 1, 5, now - 5),
    }
    assert queue.ack(delivered.values()) == set(delivered)
    assert queue.check_invariants().messages == 0


def test_a_message_staged_before_its_delivery_keeps_its_due_time_and_budget(
    queue: Queue,
) -> None:
    message_id = queue.send("x", retry_count=30)
    sent = queue.peek(message_id)
    assert sent is not None
    wait_for(lambda: queue.stats()["due"], what="the message due")
    assert queue.fetch(0).messages == []  # staged in ready
    staged = queue.peek(message_id)
    assert staged is not None
    assert (staged.state, staged.attempt, staged.budget) == ("ready", 0, 30)
    [message] = queue.fetch(1).messages
    assert (message.due_ms, message.retry_count) == (sent.score_ms, 30)


def test_all_keys_of_a_queue_share_one_hash_slot(redis_queue: Queue) -> None:
    from redis.crc import key_slot

    keys = redis_queue.store.keys
    slots = {key_slot(key.encode()) for key in [*keys.layout, keys.wakeup_channel]}
    assert len(slots) == 1
    assert keys.tag == "{delayqueue:default}"


def test_far_future_due_time_keeps_millisecond_precision(queue: Queue) -> None:
    from datetime import UTC, datetime

    at = datetime(9999, 12, 31, 23, 59, 59, 123000, tzinfo=UTC)
    message_id = queue.send("far", at=at)
    [entry] = queue.list_messages("pending")
    assert (entry.id, entry.score_ms) == (message_id, 253402300799123)


@pytest.mark.parametrize("state", ["pending", "ready", "retry"])
def test_cancel_removes_a_waiting_message_for_good(queue: Queue, state: str) -> None:
    message_id = queue.send("x", delay=0 if state != "pending" else 60)
    if state == "ready":
        queue.fetch(0)  # stage it
    if state == "retry":
        [message] = fetch_when_due(queue)
        queue.nack([message], delay=0)
        queue.fetch(0)
    assert states_of(queue, message_id) == [state]

    assert queue.cancel(message_id) is True
    assert states_of(queue, message_id) == []
    assert queue.peek(message_id) is None
    assert queue.cancel(message_id) is False
    time.sleep(0.01)
    assert queue.fetch().messages == []


def test_cancel_refuses_in_flight_handled_dead_and_unknown_messages(queue: Queue) -> None:
    in_flight = queue.send("x")
    fetch_when_due(queue)
    assert queue.cancel(in_flight) is False
    assert states_of(queue, in_flight) == ["unack"]

    dead = queue.send("y", retry_count=0)
    [message] = fetch_when_due(queue)
    queue.nack([message])
    assert queue.cancel(dead) is False
    assert states_of(queue, dead) == ["garbage"]

    handled = queue.send("z")
    [message] = fetch_when_due(queue)
    queue.ack([message])
    assert queue.cancel(handled) is False
    assert queue.cancel("no-such-id") is False


def test_fetch_says_when_an_exhaustion_announcement_is_owed(queue: Queue) -> None:
    queue.send("x", retry_count=0)
    [message] = fetch_when_due(queue)
    assert queue.fetch(0).exhaustions_owed is False
    queue.nack([message])
    assert queue.fetch(0).exhaustions_owed is True
    [claim] = queue.claim_exhausted(10)
    assert queue.fetch(0).exhaustions_owed is False  # claimed: owed again only if it lapses
    queue.confirm_exhausted([claim])
    assert queue.fetch(0).exhaustions_owed is False


def test_next_wakeup_includes_the_lapse_of_an_exhaustion_claim(queue: Queue) -> None:
    queue.send("x", retry_count=0)
    [message] = fetch_when_due(queue)
    queue.nack([message])
    queue.claim_exhausted(10, claim_seconds=60)
    result = queue.fetch(0)
    assert result.next_ms is not None
    assert 59_000 <= result.next_ms - result.now_ms <= 60_000


def test_each_delivery_carries_the_time_it_became_due(configure: Callable[..., Queue]) -> None:
    queue = configure(NACK_REDELIVERY_DELAY=[0.05], MAX_CONSUME_DURATION=0.1, RETRY_COUNT=5)
    message_id = queue.send("x", delay=0.05)
    sent = queue.peek(message_id)
    assert sent is not None
    [first] = fetch_when_due(queue)
    assert first.due_ms == sent.score_ms

    [outcome] = queue.nack([first])
    [retried] = fetch_when_due(queue)
    assert retried.due_ms == outcome.at_ms

    # Not acked in time: the redelivery was due when the deadline passed.
    [timed_out] = fetch_when_due(queue)
    assert timed_out.due_ms == retried.deadline_ms

    queue.bury([timed_out])
    before = store_time_ms(queue)
    queue.requeue([message_id])
    [requeued] = fetch_when_due(queue)
    assert before <= requeued.due_ms <= store_time_ms(queue)
    queue.ack([requeued])

    later_id = queue.send("y", delay=3600)
    before = store_time_ms(queue)
    queue.deliver_now([later_id])
    [promoted] = fetch_when_due(queue)
    assert before <= promoted.due_ms <= store_time_ms(queue)


def test_a_meta_record_without_a_due_time_is_still_delivered(redis_queue: Queue, raw: Any) -> None:
    # Records written before the due time was kept have three fields.
    queue = redis_queue
    message_id = queue.send("old")
    raw.hset(queue.store.keys.key("meta"), message_id, "0:0:3")
    [message] = fetch_when_due(queue)
    assert (message.id, message.attempt, message.retry_count, message.due_ms) == (
        message_id,
        1,
        3,
        0,
    )
    assert queue.ack([message]) == {message_id}


def test_stats_keep_running_totals_that_pruning_leaves_alone(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(NACK_REDELIVERY_DELAY=[0], MAX_CONSUME_DURATION=0.05, RETRY_COUNT=1)
    acked, refused, slow = queue.send_many(["acked", "refused", "slow"])
    by_id = {message.id: message for message in fetch_when_due(queue, count=3)}
    queue.ack([by_id[acked]])
    queue.nack([by_id[refused]])  # retried
    time.sleep(0.1)  # slow times out: retried too
    again = {message.id: message for message in fetch_when_due(queue, count=3)}
    assert set(again) == {refused, slow}
    queue.nack([again[refused]])  # last attempt: exhausted
    time.sleep(0.1)
    queue.fetch()  # slow times out on its last attempt: exhausted

    queue.prune_throughput()
    stats = queue.stats()
    totals = {name: stats[f"{name}_total"] for name in ("acked", "failed", "retried")}
    assert totals == {"acked": 1, "failed": 4, "retried": 2}
    assert (stats["timed_out_total"], stats["exhausted_total"]) == (2, 2)


def test_a_repeated_fetch_request_hands_out_again_what_it_took(queue: Queue) -> None:
    # A fetch whose reply was lost (Redis ran it; the fetcher never saw the answer) is
    # repeated with the same request id: the same deliveries again, with new leases and
    # the same attempt, and nothing new.
    ids = queue.send_many(["a", "b", "c"])
    lost = wait_for(
        lambda: queue.fetch(2, fetcher="w1", request="1").messages, timeout=5, what="delivery"
    )
    again = queue.fetch(3, fetcher="w1", request="1").messages
    assert [m.id for m in again] == [m.id for m in lost]
    first, second = (m.id for m in again)
    [third] = set(ids) - {first, second}
    assert [m.attempt for m in again] == [1, 1]
    assert all(a.lease > b.lease for a, b in zip(again, lost, strict=True))
    assert queue.ack(lost) == set()  # the lost reply's leases are void
    assert queue.stats()["unack"] == 2

    assert queue.ack(again[:1]) == {first}
    # Repeated once more (that reply was lost too): what is still in flight.
    [still] = queue.fetch(3, fetcher="w1", request="1").messages
    assert (still.id, still.attempt) == (second, 1)
    # A new request takes new work, and other fetchers never see a fetcher's record.
    assert [m.id for m in queue.fetch(3, fetcher="w2", request="1").messages] == [third]
    assert queue.fetch(3, fetcher="w1", request="2").messages == []
    assert queue.fetch(3, fetcher="w1", request="2").messages == []
    assert queue.ack([still]) == {second}


def test_a_repeated_fetch_request_skips_what_timed_out_since(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.1)
    message_id = queue.send("slow")
    [lost] = wait_for(
        lambda: queue.fetch(1, fetcher="w", request="7").messages, timeout=5, what="delivery"
    )
    time.sleep(0.2)  # its deadline passes: the next fetch takes it as a retry
    [retried] = fetch_when_due(queue)
    assert (retried.id, retried.attempt) == (message_id, 2)
    assert queue.fetch(1, fetcher="w", request="7").messages == []
    assert queue.ack([lost]) == set()
    assert queue.ack([retried]) == {message_id}


def _msgpack(value: str | int | list[Any]) -> bytes:
    """msgpack of short strings, small integers and short lists of them, as Lua's cmsgpack
    writes them."""
    if isinstance(value, list):
        assert len(value) < 16
        return bytes([0x90 + len(value)]) + b"".join(map(_msgpack, value))
    if isinstance(value, int):
        assert 0 <= value < 128
        return bytes([value])
    assert len(value.encode()) < 32
    return bytes([0xA0 + len(value.encode())]) + value.encode()


def test_a_fetchers_replay_record_lives_as_long_as_its_deliveries_lease(
    redis_configure: Callable[..., Queue],
) -> None:
    # About Redis: one small key per fetcher, never one per fetch, and it never outlives the
    # deliveries it lists (nothing else in the queue expires).
    queue = redis_configure(MAX_CONSUME_DURATION=30)
    client: Any = redis_store(queue).client
    record = redis_store(queue).keys.key("fetch:w1")
    queue.send_many(["a", "b"])
    handed = wait_for(
        lambda: queue.fetch(5, fetcher="w1", request="1").messages, timeout=5, what="delivery"
    )
    entries = [value for m in handed for value in (m.id, m.lease)]
    assert client.get(record) == _msgpack("1") + _msgpack(entries)
    assert 29_000 < client.pttl(record) <= 30_000
    assert queue.fetch(5, fetcher="w1", request="2").messages == []
    assert client.exists(record) == 0  # a new request: the last reply arrived
    assert queue.fetch(5).messages == []  # fetching without a request keeps no record
    assert client.keys("*fetch*") == []


def test_a_stale_ack_from_an_ids_earlier_life_leaves_its_waiting_retry_alone(
    configure: Callable[..., Queue],
) -> None:
    # An id lives again when a send is replayed after its message was handled (send.lua's
    # header: "a replay arriving after that schedules the message again"). A delivery of the
    # first life that timed out still holds its token; the second life's lease climbs again
    # from 0 and may equal it while the message waits (pending, not in unack). An ack that
    # read the lease alone (#34, found by review) took it: it deleted the payload and the
    # meta record and left the id in pending, the retry lost.
    queue = configure(MAX_CONSUME_DURATION=0.05)
    queue.store.send([NewMessage("again", '"x"', 3)])
    # First life: lease 1, buried (2), requeued (3), handed out again (4).
    [d1] = fetch_when_due(queue)
    queue.bury([d1])
    assert queue.requeue(["again"]) == ["again"]
    [stale] = fetch_when_due(queue)
    assert stale.lease == 4
    # That delivery's worker is slow: it times out (5), the next delivery (6) is acked.
    time.sleep(0.1)
    [d3] = fetch_when_due(queue)
    assert queue.ack([d3]) == {"again"}
    assert states_of(queue, "again") == []
    # Second life (the send's replay, its first reply lost): 1, nacked (2), 3, nacked (4).
    queue.store.send([NewMessage("again", '"x"', 3)])
    [e1] = fetch_when_due(queue)
    queue.nack([e1], delay=0)
    [e2] = fetch_when_due(queue)
    queue.nack([e2], delay=60)
    assert states_of(queue, "again") == ["pending"]
    # The first life's slow worker finally acks: nothing may change.
    assert queue.ack([stale]) == set()
    assert states_of(queue, "again") == ["pending"]
    assert queue.peek("again") is not None
    report = queue.check_invariants()
    assert report.ok, report.problems
