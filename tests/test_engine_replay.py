"""Calls whose reply was lost after Redis ran them, sent again (redis-py re-sends after a
timeout or a cut connection when retries are configured, and Redis Cluster clients always do;
the worker repeats a failed call itself). A replayed send is acknowledged, never refused as a
duplicate of itself, and writes nothing twice; an ack or nack repeated under the same request
id changes nothing and answers what the first run did. (Lost fetch replies: see
test_engine_lifecycle.)"""

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import NewMessage
from delayqueue_django.exceptions import DuplicateMessageId
from tests.helpers import fetch_when_due, redis_store, states_of
from tests.redis_servers import RedisServer


def test_a_replayed_send_is_acknowledged_and_written_once(queue: Queue) -> None:
    batch = [NewMessage("a", '"one"', 3, delay_us=60_000_000), NewMessage("b", '"two"', 3)]
    first = queue.store.send(batch)
    queue.fetch(1)  # b is in flight before the replay arrives
    time.sleep(0.002)  # so that the replay's now is not b's due time
    # Each one's due time as it was given, b's too though it is no longer pending (the reply
    # said "now" for it, as if it had been scheduled again).
    assert queue.store.send(batch) == first
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert (report.counts["pending"], report.counts["unack"], report.messages) == (1, 1, 2)


def test_a_send_replayed_once_its_message_is_dead_schedules_nothing(queue: Queue) -> None:
    batch = [NewMessage("dead", '"x"', 0)]
    [due] = queue.store.send(batch)
    [message] = queue.fetch().messages
    queue.nack([message])  # no retries: buried
    time.sleep(0.002)  # so that the replay's now is not its due time
    assert queue.store.send(batch) == [due]  # the time it was due, not a new one
    stats = queue.stats()
    assert (stats["pending"], stats["ready"], stats["garbage"]) == (0, 0, 1)


def test_a_send_replayed_after_its_message_was_handled_sends_it_again(queue: Queue) -> None:
    # The window the docs describe: once acked, nothing of the message is left to tell a
    # replay from a new message, so a replay arriving that late (the message was due within
    # the client's retry window, and handled) delivers it a second time: at least once.
    batch = [NewMessage("quick", '"x"', 3)]
    queue.store.send(batch)
    [message] = queue.fetch().messages
    assert queue.ack([message]) == {"quick"}
    queue.store.send(batch)
    [again] = queue.fetch().messages
    assert (again.id, again.attempt) == ("quick", 1)


def test_an_id_reused_for_another_payload_is_still_refused(queue: Queue) -> None:
    queue.store.send([NewMessage("a", '"one"', 3)])
    with pytest.raises(DuplicateMessageId):
        queue.store.send([NewMessage("new", '"x"', 3), NewMessage("a", '"other"', 3)])
    assert queue.peek("new") is None


def test_a_send_of_one_message_is_judged_as_a_batch_is(queue: Queue) -> None:
    # A batch of one writes its payload only where the id is new (issue #34: one command
    # checks and writes it): a replay is answered with its due time, a duplicate refused,
    # and neither changes what is stored.
    message = NewMessage("one", '"first"', 3, delay_us=60_000_000)
    [due] = queue.store.send([message])
    time.sleep(0.002)
    assert queue.store.send([message]) == [due]
    with pytest.raises(DuplicateMessageId):
        queue.store.send([NewMessage("one", '"second"', 3)])
    stored = queue.peek("one")
    assert stored is not None
    assert (stored.payload, stored.score_ms) == ('"first"', due)
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert (report.counts["pending"], report.messages) == (1, 1)


def test_an_id_given_twice_is_judged_per_entry_as_replay_or_duplicate(queue: Queue) -> None:
    # Only direct store calls can do this (Queue makes the ids); every store must agree.
    queue.store.send([NewMessage("a", '"one"', 3)])
    with pytest.raises(DuplicateMessageId):
        queue.store.send(
            [NewMessage("new", '"x"', 3), NewMessage("a", '"one"', 3), NewMessage("a", '"two"', 3)]
        )
    assert queue.peek("new") is None
    stored = queue.peek("a")
    assert stored is not None
    assert stored.payload == '"one"'


@pytest.fixture
def sleepy_redis() -> Iterator[RedisServer]:
    server = RedisServer("--enable-debug-command", "yes")
    yield server
    server.close()


def test_a_send_timing_out_on_a_stalled_redis_is_retried_without_a_false_error(
    sleepy_redis: RedisServer, settings: Any
) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": sleepy_redis.url,
            "OPTIONS": {"socket_timeout": 0.3, "retry": Retry(NoBackoff(), 5)},
        }
    }
    queue = get_queue()
    queue.send("warm-up")  # scripts loaded, server version read
    stall = threading.Thread(
        target=sleepy_redis.client(socket_timeout=5).execute_command, args=("DEBUG", "SLEEP", "1")
    )
    stall.start()
    time.sleep(0.1)
    message_id = queue.send("sent while Redis stalls")  # times out, then is sent again
    stall.join()
    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.payload == '"sent while Redis stalls"'
    assert queue.stats()["pending"] == 2


def test_a_repeated_ack_request_answers_what_it_acked(queue: Queue) -> None:
    ids = queue.send_many(["a", "b"])
    messages = fetch_when_due(queue, count=2)
    assert queue.ack(messages, fetcher="w1", request="1") == set(ids)
    # Its reply was lost: the same request again is told what it did, and does nothing more.
    assert queue.ack(messages, fetcher="w1", request="1") == set(ids)
    assert queue.stats()["acked_total"] == 2
    # A new request, another fetcher's, or one without an id is judged afresh: spent leases.
    assert queue.ack(messages, fetcher="w1", request="2") == set()
    assert queue.ack(messages, fetcher="w2", request="1") == set()
    assert queue.ack(messages) == set()


def test_a_repeated_ack_request_is_answered_from_its_record_even_where_its_lease_holds_again(
    queue: Queue,
) -> None:
    # The id sent again once acked (only direct store calls choose ids) and handed out under
    # the same first lease: the repeat of the first ack request must answer what that request
    # did, not ack the new delivery, though it would hold (issue #34: the ack reads its
    # record with the write of its own, when it has something to ack).
    batch = [NewMessage("again", '"x"', 3)]
    queue.store.send(batch)
    [first] = fetch_when_due(queue)
    assert queue.ack([first], fetcher="w", request="1") == {"again"}
    queue.store.send(batch)
    [second] = fetch_when_due(queue)
    assert (second.id, second.lease) == (first.id, first.lease)
    assert queue.ack([first], fetcher="w", request="1") == {"again"}
    assert states_of(queue, "again") == ["unack"]
    assert queue.stats()["acked_total"] == 1
    # Its record still answers a further repeat; a new request acks the new delivery.
    assert queue.ack([first], fetcher="w", request="1") == {"again"}
    assert queue.ack([second], fetcher="w", request="2") == {"again"}
    assert states_of(queue, "again") == []


def test_a_repeated_nack_or_bury_request_answers_what_it_did(
    configure: Callable[..., Queue],
) -> None:
    queue = configure(RETRY_COUNT=1, NACK_REDELIVERY_DELAY=60)
    retried, buried = queue.send_many(["retried", "buried"])
    by_id = {message.id: message for message in fetch_when_due(queue, count=2)}

    [retry] = queue.nack([by_id[retried]], fetcher="w", request="5")
    assert queue.nack([by_id[retried]], fetcher="w", request="5") == [retry]
    assert not retry.exhausted
    [burial] = queue.bury([by_id[buried]], fetcher="w", request="6")
    assert queue.bury([by_id[buried]], fetcher="w", request="6") == [burial]
    assert burial.exhausted

    stats = queue.stats()
    assert (stats["pending"], stats["garbage"], stats["unack"]) == (1, 1, 0)
    assert (stats["failed_total"], stats["retried_total"], stats["exhausted_total"]) == (2, 1, 1)
    assert queue.nack([by_id[retried]], fetcher="w", request="7") == []


def test_a_commit_record_is_kept_only_for_a_named_request_that_changed_something(
    redis_configure: Callable[..., Queue],
) -> None:
    # About Redis: one small key per fetcher, expiring with a lease; none for a call without
    # a request id, nor for one that changed nothing (so that such a call writes nothing: a
    # Redis out of memory would refuse that write).
    queue = redis_configure(MAX_CONSUME_DURATION=30)
    client: Any = redis_store(queue).client
    record = redis_store(queue).keys.key("commit:w1")
    queue.send_many(["a", "b"])
    first, second = fetch_when_due(queue, count=2)
    assert queue.ack([first]) == {first.id}
    assert queue.ack([first], fetcher="w1", request="1") == set()
    assert client.exists(record) == 0
    assert queue.ack([second], fetcher="w1", request="2") == {second.id}
    assert 29_000 < client.pttl(record) <= 30_000


def test_an_ack_timing_out_on_a_stalled_redis_and_sent_again_is_told_what_it_did(
    sleepy_redis: RedisServer, settings: Any
) -> None:
    settings.DELAYQUEUES = {
        "default": {
            "URL": sleepy_redis.url,
            "OPTIONS": {"socket_timeout": 0.3, "retry": Retry(NoBackoff(), 5)},
        }
    }
    queue = get_queue()
    queue.send_many(["named", "unnamed"])
    by_payload = {message.payload: message for message in fetch_when_due(queue, count=2)}
    # Load the ack script first: else the stalled call's first run answers NOSCRIPT, and the
    # ack only happens when the client sends it again with the script.
    assert queue.store.ack([("no such id", 0)]) == set()

    def stall() -> threading.Thread:
        client = sleepy_redis.client(socket_timeout=5)
        thread = threading.Thread(target=client.execute_command, args=("DEBUG", "SLEEP", "1"))
        thread.start()
        time.sleep(0.1)
        return thread

    # Redis runs the ack when it wakes, but the client has given up on that reply and sent
    # the ack again: named, the repeat is told what the first run did.
    stalled = stall()
    named = by_payload["named"]
    assert queue.ack([named], fetcher="w", request="1") == {named.id}
    stalled.join()
    # Without a request id, the repeat finds nothing left, as for an ack that came too late.
    stalled = stall()
    assert queue.ack([by_payload["unnamed"]]) == set()
    stalled.join()
    stats = queue.stats()
    assert (stats["unack"], stats["acked_total"]) == (0, 2)
