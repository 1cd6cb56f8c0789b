"""Outcome records (issue #35, HISTORY_RETENTION), the engine's contract: with the option
set, a message that ends leaves a record of how and when, its attempts, its key and (acked)
its worker, written in the call that ends it, which ``message(id)`` and ``lookup(key)``
answer until the retention passes; a key or id never used answers None; with the option off
nothing is written.

Run on the memory store, on Redis (single, Cluster, Valkey, scripts) and on sharded queues."""

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import EXPIRED, StoredMessage
from tests.backends import REDIS_BACKENDS, SHARDED_BACKENDS
from tests.helpers import store_time_ms, wait_for

pytestmark = pytest.mark.parametrize(
    "backend_url", [*REDIS_BACKENDS, "memory", *SHARDED_BACKENDS], indirect=True
)

KEPT = timedelta(minutes=5)  # a retention no test outlives
WORKER = "host-1:4242:a1b2c3"  # as a worker names itself (Worker.worker_id)
SHORT = 0.3  # seconds: a retention, expiry or lease a test outlives


def outlive(queue: Queue, seconds: float = SHORT) -> None:
    """Wait until the store's clock has passed ``seconds`` from now."""
    until = store_time_ms(queue) + int(seconds * 1000) + 1
    wait_for(lambda: store_time_ms(queue) > until, what="the store's clock")


def moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)


def ended(found: StoredMessage | None, state: str) -> StoredMessage:
    """``found``, checked to be an outcome record of ``state``."""
    assert found is not None
    assert found.state == state
    assert found.ended_at is not None
    assert (found.payload, found.score_ms, found.lease) == (None, None, None)
    return found


@pytest.fixture
def kept(configure: Callable[..., Queue]) -> Queue:
    return configure(HISTORY_RETENTION=KEPT)


def test_an_acked_message_says_when_which_worker_and_how_many_attempts(kept: Queue) -> None:
    message_id = kept.send({"n": 1})
    [first] = kept.fetch(1, fetcher=WORKER).messages
    kept.nack([first], delay=0)
    before = store_time_ms(kept)
    [again] = kept.fetch(1, fetcher=WORKER).messages
    assert kept.ack([again], fetcher=WORKER) == {message_id}
    after = store_time_ms(kept)
    assert kept.peek(message_id) is None  # peek answers only what the queue holds
    record = ended(kept.message(message_id), "acked")
    assert record.id == message_id
    assert (record.attempt, record.worker, record.key) == (2, WORKER, None)
    assert record.ended_at is not None
    assert moment(before) <= record.ended_at <= moment(after)


def test_a_keyed_message_acked_is_what_its_key_names(kept: Queue) -> None:
    message_id = kept.send({"order": 42}, key="reminder:42")
    [message] = kept.fetch(1, fetcher=WORKER).messages
    kept.ack([message], fetcher=WORKER)
    record = ended(kept.lookup("reminder:42"), "acked")
    assert (record.id, record.key, record.attempt) == (message_id, "reminder:42", 1)
    assert ended(kept.message(message_id), "acked").key == "reminder:42"


def test_a_message_still_stored_answers_as_peek_does(kept: Queue) -> None:
    message_id = kept.send({"n": 1}, key="k", delay=60)
    found = kept.message(message_id)
    assert found == kept.peek(message_id)
    assert found is not None
    assert (found.state, found.ended_at, found.worker) == ("pending", None, None)


def test_a_cancelled_message_by_id_or_key_says_cancelled(kept: Queue) -> None:
    by_id = kept.send({"n": 1}, delay=60)
    by_key = kept.send({"n": 2}, key="k", delay=60)
    assert kept.cancel(by_id)
    assert kept.cancel(key="k")
    assert ended(kept.message(by_id), "cancelled").attempt == 0
    record = ended(kept.lookup("k"), "cancelled")
    assert (record.id, record.key, record.worker) == (by_key, "k", None)


def test_a_message_deleted_in_flight_says_cancelled(kept: Queue) -> None:
    message_id = kept.send({"n": 1})
    kept.fetch(1)
    assert kept.delete(message_id) == "unack"
    assert ended(kept.message(message_id), "cancelled").attempt == 1


def test_a_keyed_message_superseded_on_its_retry_says_replaced(kept: Queue) -> None:
    first = kept.send({"v": 1}, key="k")
    [message] = kept.fetch(1).messages
    newer = kept.send({"v": 2}, key="k", delay=60)  # the first is in flight: a new message
    [outcome] = kept.nack([message], delay=0)
    assert outcome.superseded
    assert ended(kept.message(first), "replaced").key == "k"
    found = kept.lookup("k")  # the key names its waiting message, not the record
    assert found is not None
    assert (found.id, found.state) == (newer, "pending")


def test_a_keyed_message_superseded_on_its_release_says_replaced(kept: Queue) -> None:
    first = kept.send({"v": 1}, key="k")
    [message] = kept.fetch(1).messages
    kept.send({"v": 2}, key="k", delay=60)
    assert kept.release([message]) == []
    record = ended(kept.message(first), "replaced")
    # Its attempts as its last delivery counted them: a superseded message's record is not
    # rewritten (the release gives the attempt back only to a message that waits again).
    assert (record.key, record.attempt) == ("k", 1)


def test_a_keyed_message_superseded_on_its_postpone_says_replaced(kept: Queue) -> None:
    first = kept.send({"v": 1}, key="k")
    [message] = kept.fetch(1).messages
    kept.send({"v": 2}, key="k", delay=60)
    [outcome] = kept.postpone([message], delay=0)
    assert outcome.superseded
    assert ended(kept.message(first), "replaced").attempt == 1


def test_a_keyed_message_superseded_as_it_times_out_says_replaced(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(HISTORY_RETENTION=KEPT, MAX_CONSUME_DURATION=SHORT)
    first = queue.send({"v": 1}, key="k")
    queue.fetch(1)
    queue.send({"v": 2}, key="k", delay=60)
    outlive(queue)
    queue.fetch(0)  # housekeeping: the timed-out delivery is superseded
    assert ended(queue.message(first), "replaced").attempt == 1


def test_a_replace_keeps_the_message_so_nothing_ends(kept: Queue) -> None:
    message_id = kept.send({"v": 1}, key="k", delay=60)
    assert kept.send({"v": 2}, key="k", delay=60, if_exists="replace") == message_id
    found = kept.message(message_id)
    assert found is not None
    assert (found.state, found.payload) == ("pending", '{"v":2}')


def test_a_dead_letter_deleted_says_purged(kept: Queue) -> None:
    purged, deleted = kept.send({"n": 1}), kept.send({"n": 2}, key="k")
    messages = kept.fetch(2).messages
    kept.bury(messages)
    assert kept.delete(deleted, state="garbage") == "garbage"
    assert kept.purge_garbage() == 1
    assert ended(kept.message(purged), "purged").attempt == 1
    assert ended(kept.lookup("k"), "purged").id == deleted


def test_a_dead_letter_past_its_retention_says_purged(configure: Callable[..., Queue]) -> None:
    queue = configure(HISTORY_RETENTION=KEPT, GARBAGE_RETENTION=0)
    message_id = queue.send({"n": 1})
    [message] = queue.fetch(1).messages
    queue.bury([message])
    queue.confirm_exhausted(queue.claim_exhausted())
    outlive(queue, 0.01)
    assert queue.expire_garbage() == 1
    ended(queue.message(message_id), "purged")


def test_an_expired_message_is_its_dead_letter_then_says_expired(kept: Queue) -> None:
    message_id = kept.send({"n": 1}, key="k", expires=SHORT)
    outlive(kept)
    kept.fetch(0)
    dead = kept.message(message_id)
    assert dead is not None
    assert (dead.state, dead.dead_reason, dead.ended_at) == ("garbage", EXPIRED, None)
    assert dead.score_ms is not None
    kept.purge_garbage()
    record = ended(kept.message(message_id), "expired")
    assert record.ended_at == moment(dead.score_ms)  # when it was buried, not purged
    assert ended(kept.lookup("k"), "expired").id == message_id


def test_a_key_or_id_never_used_answers_none(kept: Queue) -> None:
    assert kept.message("never-sent") is None
    assert kept.lookup("never-used") is None


def test_the_record_goes_when_its_retention_passes(configure: Callable[..., Queue]) -> None:
    queue = configure(HISTORY_RETENTION=SHORT)
    message_id = queue.send({"n": 1}, key="k")
    [message] = queue.fetch(1).messages
    queue.ack([message])
    ended(queue.message(message_id), "acked")
    ended(queue.lookup("k"), "acked")
    outlive(queue)
    assert queue.message(message_id) is None
    assert queue.lookup("k") is None


def test_a_message_sent_again_under_its_id_answers_as_stored(kept: Queue) -> None:
    message_id = kept.send({"n": 1}, key="k")
    [message] = kept.fetch(1).messages
    kept.ack([message])
    again = kept.send({"n": 2}, key="k", delay=60)
    found = kept.lookup("k")
    assert found is not None
    assert (found.id, found.state) == (again, "pending")
    assert ended(kept.message(message_id), "acked").id == message_id


def test_without_the_option_nothing_is_kept(queue: Queue) -> None:
    acked = queue.send({"n": 1}, key="a")
    cancelled = queue.send({"n": 2}, key="c", delay=60)
    [message] = queue.fetch(1).messages
    queue.ack([message])
    queue.cancel(cancelled)
    assert queue.message(acked) is None
    assert queue.lookup("a") is None
    assert queue.store.ended(acked) is None
    assert queue.store.ended(key="c") is None


def test_amessage_answers_as_message(kept: Queue) -> None:
    async def scenario() -> tuple[str, StoredMessage | None, StoredMessage | None]:
        message_id = await kept.asend({"n": 1}, key="k", delay=60)
        await kept.acancel(message_id)
        return message_id, await kept.amessage(message_id), await kept.alookup("k")

    message_id, by_id, by_key = asyncio.run(scenario())
    assert ended(by_id, "cancelled").id == message_id
    assert ended(by_key, "cancelled").id == message_id
