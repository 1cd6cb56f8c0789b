"""Expiry, Postpone and Retry (issue #27), the engine's contract: every store answers these
alike, through the Queue and Store API. A message is never handed out at or after its
expiry: fetch dead-letters it as it stages or takes it (reason "expired"), and a retry or
postpone due at or after it expires it at once. A postpone uses no attempt, up to the
queue's MAX_POSTPONES; a Retry's delay overrides the backoff.

Run on the memory store, on Redis (single, Cluster, Valkey, scripts) and on sharded queues."""

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import EXPIRED, POSTPONED_TOO_OFTEN, InvalidExpiry, NewMessage
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)

SHORT = 0.3  # an expiry a test outlives (seconds)


def outlive(queue: Queue, seconds: float = SHORT) -> None:
    """Wait until the store's clock has passed ``seconds`` from now."""
    until = store_time_ms(queue) + int(seconds * 1000) + 1
    wait_for(lambda: store_time_ms(queue) > until, what="the store's clock")


def garbage_reason(queue: Queue, message_id: str) -> str:
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.state == "garbage"
    return stored.dead_reason


# Refusals: nothing written


@pytest.mark.parametrize(
    "options",
    [
        {"expires": -1},
        {"expires": 0},
        {"expires": 1, "delay": 2},
        {"expires": 2, "delay": 2},
        {"expires": timedelta(seconds=-5)},
        {"expires": "soon"},
        {"expires": float("nan")},
    ],
)
def test_an_expiry_that_could_never_let_it_out_is_refused(
    queue: Queue, options: dict[str, object]
) -> None:
    with pytest.raises(InvalidExpiry):
        queue.send({"n": 1}, **options)  # type: ignore[arg-type]
    assert queue.stats()["pending"] == 0


def test_a_datetime_expiry_in_the_past_or_before_at_is_refused(queue: Queue) -> None:
    now = timezone.now()
    with pytest.raises(InvalidExpiry, match="in the past"):
        queue.send({"n": 1}, expires=now - timedelta(seconds=1))
    with pytest.raises(InvalidExpiry, match="due time"):
        queue.send({"n": 1}, at=now + timedelta(minutes=10), expires=now + timedelta(minutes=5))
    with pytest.raises(InvalidExpiry):
        queue.send_many([{"n": 1}, {"n": 2}], delay=60, expires=now + timedelta(seconds=30))
    assert queue.stats()["pending"] == 0


def test_the_store_refuses_a_batch_with_an_expiry_before_its_due_time(queue: Queue) -> None:
    """The store decides on its own clock: a batch with one such message writes nothing
    (both on one shard of a sharded queue, where a batch is atomic per shard)."""
    [good, bad] = queue.store.place([uuid.uuid4().hex, uuid.uuid4().hex], ["same", "same"])
    batch = [
        NewMessage(good, "{}", 1, expires_in_us=60_000_000),
        NewMessage(bad, "{}", 1, delay_us=2_000_000, expires_in_us=1_000_000),
    ]
    with pytest.raises(InvalidExpiry, match=bad):
        queue.store.send(batch)
    assert queue.stats()["pending"] == 0


# Expiry


def test_a_message_expired_before_staging_is_dead_lettered_not_staged(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=SHORT)
    outlive(queue)
    fetched = queue.fetch(0)  # housekeeping only: stages what is due
    assert fetched.exhaustions_owed
    stats = queue.stats()
    assert (stats["pending"], stats["ready"], stats["garbage"]) == (0, 0, 1)
    assert (stats["expired_total"], stats["exhausted_total"]) == (1, 0)
    assert garbage_reason(queue, message_id) == EXPIRED
    [claim] = queue.claim_exhausted()
    assert (claim.id, claim.reason, claim.payload, claim.attempt) == (
        message_id,
        EXPIRED,
        {"n": 1},
        0,
    )
    assert queue.confirm_exhausted([claim]) == 1


def test_a_staged_message_that_expires_is_dead_lettered_at_hand_out(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=SHORT)
    other = queue.send({"n": 2})
    queue.fetch(0)
    assert queue.stats()["ready"] == 2
    outlive(queue)
    fetched = queue.fetch(10)
    assert [message.id for message in fetched.messages] == [other]
    assert garbage_reason(queue, message_id) == EXPIRED
    assert queue.stats()["expired_total"] == 1


def test_a_message_handed_out_before_its_expiry_is_handled_normally(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=60)
    [message] = queue.fetch(1).messages
    assert message.id == message_id
    assert queue.ack([message]) == {message_id}
    assert queue.stats()["garbage"] == 0


def test_a_retry_due_after_the_expiry_expires_instead(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=2)
    [message] = queue.fetch(1).messages
    [outcome] = queue.nack([message], delay=5)
    assert (outcome.exhausted, outcome.dead_reason) == (True, EXPIRED)
    assert garbage_reason(queue, message_id) == EXPIRED
    assert queue.stats()["expired_total"] == 1
    [claim] = queue.claim_exhausted()
    assert claim.reason == EXPIRED


def test_a_retry_due_before_the_expiry_is_retried(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=60)
    [message] = queue.fetch(1).messages
    [outcome] = queue.nack([message], delay=0)
    assert not outcome.exhausted
    [again] = wait_for(lambda: queue.fetch(1).messages, what="the retry")
    assert (again.id, again.attempt) == (message_id, 2)


def test_a_timed_out_delivery_past_its_expiry_is_not_handed_out_again(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(MAX_CONSUME_DURATION=0.2)
    message_id = queue.send({"n": 1}, expires=0.4)
    assert len(queue.fetch(1).messages) == 1
    outlive(queue, 0.5)
    assert queue.fetch(1).messages == []
    assert garbage_reason(queue, message_id) == EXPIRED


def test_the_queue_default_counts_from_the_due_time(configure: Callable[..., Queue]) -> None:
    queue = configure(EXPIRES=SHORT)
    late = queue.send({"n": 1})
    delayed = queue.send({"n": 2}, delay=1)  # not refused: its expiry follows its due time
    outlive(queue)
    assert queue.fetch(10).messages == []
    assert garbage_reason(queue, late) == EXPIRED
    [message] = wait_for(lambda: queue.fetch(10).messages, what="the delayed message")
    assert message.id == delayed


def test_an_explicit_expiry_overrides_the_default(configure: Callable[..., Queue]) -> None:
    queue = configure(EXPIRES=SHORT)
    message_id = queue.send({"n": 1}, expires=timezone.now() + timedelta(minutes=1))
    outlive(queue)
    [message] = queue.fetch(1).messages
    assert message.id == message_id


def test_a_requeued_expired_message_runs_without_its_expiry(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=SHORT)
    outlive(queue)
    queue.fetch(0)
    assert queue.requeue([message_id]) == [message_id]
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.dead_reason == ""
    [message] = queue.fetch(1).messages
    assert message.id == message_id


def test_a_keyed_message_keeps_its_expiry_until_replaced_without_one(queue: Queue) -> None:
    first = queue.send({"n": 1}, key="k", expires=SHORT, delay=0.1)
    assert queue.send({"n": 2}, key="k", if_exists="replace", delay=0.1) == first
    outlive(queue)
    [message] = queue.fetch(1).messages
    assert (message.id, message.payload) == (first, {"n": 2})

    second = queue.send({"n": 3}, key="j", expires=SHORT)
    outlive(queue)
    assert queue.fetch(1).messages == []
    assert garbage_reason(queue, second) == EXPIRED


# Postpone and Retry


def test_a_postpone_uses_no_attempt(configure: Callable[..., Queue]) -> None:
    queue = configure(RETRY_COUNT=0)
    message_id = queue.send({"n": 1})
    for _ in range(3):
        [message] = wait_for(lambda: queue.fetch(1).messages, what="the message")
        assert (message.id, message.attempt) == (message_id, 1)
        [outcome] = queue.postpone([message], delay=0)
        assert not outcome.exhausted
    stats = queue.stats()
    assert (stats["postponed_total"], stats["failed_total"], stats["garbage"]) == (3, 0, 0)


def test_a_postpone_comes_back_after_its_delay(queue: Queue) -> None:
    queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    before = store_time_ms(queue)
    [outcome] = queue.postpone([message], delay=timedelta(minutes=2))
    assert before + 120_000 <= outcome.at_ms <= store_time_ms(queue) + 120_001
    stored = queue.peek(message.id)
    assert stored is not None
    assert (stored.state, stored.score_ms, stored.attempt) == ("pending", outcome.at_ms, 0)


def test_postponing_past_the_bound_dead_letters_it(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_POSTPONES=2)
    message_id = queue.send({"n": 1})
    for _ in range(2):
        [message] = wait_for(lambda: queue.fetch(1).messages, what="the message")
        [outcome] = queue.postpone([message], delay=0)
        assert not outcome.exhausted
    [message] = wait_for(lambda: queue.fetch(1).messages, what="the message")
    [outcome] = queue.postpone([message], delay=0)
    assert (outcome.exhausted, outcome.dead_reason) == (True, POSTPONED_TOO_OFTEN)
    assert garbage_reason(queue, message_id) == POSTPONED_TOO_OFTEN
    [claim] = queue.claim_exhausted()
    assert claim.reason == POSTPONED_TOO_OFTEN
    # A requeue starts a new life: the count too.
    queue.requeue([message_id])
    [message] = wait_for(lambda: queue.fetch(1).messages, what="the requeued message")
    [outcome] = queue.postpone([message], delay=0)
    assert not outcome.exhausted


def test_a_postpone_past_the_expiry_expires(queue: Queue) -> None:
    message_id = queue.send({"n": 1}, expires=2)
    [message] = queue.fetch(1).messages
    [outcome] = queue.postpone([message], delay=5)
    assert outcome.dead_reason == EXPIRED
    assert garbage_reason(queue, message_id) == EXPIRED


def test_a_retry_delay_overrides_the_backoff_and_uses_an_attempt(queue: Queue) -> None:
    message_id = queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    before = store_time_ms(queue)
    [outcome] = queue.nack([message], delays_ms={message_id: 90_000})
    assert before + 90_000 <= outcome.at_ms <= store_time_ms(queue) + 90_001
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.attempt == 1


def test_the_invariants_hold_through_expiry_and_postpones(configure: Callable[..., Queue]) -> None:
    queue = configure(MAX_POSTPONES=1)
    expired = queue.send({"n": 1}, expires=SHORT)
    postponed = queue.send({"n": 2})
    outlive(queue)
    [message] = queue.fetch(10).messages
    assert message.id == postponed
    queue.postpone([message], delay=0)
    [message] = wait_for(lambda: queue.fetch(1).messages, what="the postponed message")
    [outcome] = queue.postpone([message], delay=0)
    assert outcome.dead_reason == POSTPONED_TOO_OFTEN
    assert garbage_reason(queue, expired) == EXPIRED
    assert queue.check_invariants().problems == []


def test_a_postponed_keyed_message_is_superseded_by_a_newer_waiting_one(queue: Queue) -> None:
    first = queue.send({"v": 1}, key="k")
    [message] = queue.fetch(1).messages
    assert message.id == first
    newer = queue.send({"v": 2}, key="k", delay=60)  # the first is in flight: a new message
    [outcome] = queue.postpone([message], delay=0)
    assert outcome.superseded
    assert queue.peek(first) is None
    found = queue.lookup("k")
    assert found is not None
    assert found.id == newer
