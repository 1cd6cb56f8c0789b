"""Committing handlers' verdicts and announcing them: a batch of acks, nacks or burials in
one round trip, then the signals, so ``message_acked`` always follows a committed ack; and
every exhaustion announced at least once. Shared by the worker's consumers and by
``delayqueue_django.testing``, so both behave alike."""

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal

from delayqueue_django import signals
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import EXPIRED, loggable
from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.sharding.placement import SHARD_MARK, shard_name, shard_of
from delayqueue_django.worker.handling import Outcome, Verdict
from delayqueue_django.worker.loop_pool import LoopPool

logger = logging.getLogger("delayqueue_django.worker")

# The order a batch of mixed verdicts is committed in: hand-backs first, so other workers
# can take those messages at once.
COMMIT_ORDER = (Verdict.RELEASE, Verdict.ACK, Verdict.NACK, Verdict.BURY)
EXHAUSTED_CLAIM_BATCH = 100


def send_robust(signal: Signal, queue: str, **kwargs: Any) -> None:
    """Send a signal to every receiver; one that raises is logged and the others are still
    called. Anything it raises, ``SystemExit`` and ``KeyboardInterrupt`` too, stops there:
    only the worker's own stop request may end the worker, never a receiver.

    Django's ``Signal.send_robust`` catches ``Exception`` only, so this walks the receivers
    itself, as that method does: ``Signal._live_receivers(sender)`` (private Django API,
    the same in 5.2 and 6.x) gives the sync receivers, called in turn, and the async ones,
    then run together in one event loop: the worker's, where its async handlers run, when
    this thread is one of its consumers and it has one (see await_receivers_on), else a
    loop of their own (async_to_sync).
    """
    if not signal.receivers:
        return
    sync_receivers, async_receivers = signal._live_receivers(Queue)
    for receiver in sync_receivers:
        try:
            receiver(signal=signal, sender=Queue, queue=queue, **kwargs)
        except BaseException as error:  # anything: see above
            _log_receiver_failure(receiver, queue, error)
    if async_receivers:

        async def call(receiver: Callable[..., Any]) -> None:
            try:
                await receiver(signal=signal, sender=Queue, queue=queue, **kwargs)
            except BaseException as error:
                _log_receiver_failure(receiver, queue, error)

        async def call_all() -> None:
            await asyncio.gather(*(call(receiver) for receiver in async_receivers))

        pool: LoopPool | None = getattr(_receivers, "loop_pool", None)
        if pool is None or not pool.run_from_thread(call_all()):
            async_to_sync(call_all)()


# Per thread: the worker's event loop that a consumer thread's signals await their async
# receivers on.
_receivers = threading.local()


def await_receivers_on(pool: LoopPool | None) -> None:
    """In this thread, signals await their ``async def`` receivers on ``pool``'s loop."""
    _receivers.loop_pool = pool


def _log_receiver_failure(receiver: Callable[..., Any], queue: str, error: BaseException) -> None:
    logger.error(
        "signal receiver %r failed queue=%s",
        receiver,
        queue,
        exc_info=(type(error), error, error.__traceback__),
    )


@dataclass(frozen=True, slots=True)
class Commit:
    """One round trip of verdicts: outcomes sharing a verdict, and the request id they are
    sent under. After a failure it is sent again as it was, same outcomes, same request:
    if Redis ran it and only the reply was lost, the repeat is told what it did (see
    ``Queue.ack``). One shard's outcomes only. Hand-backs (RELEASE) need no id: a
    repeated release changes nothing, and its reply says nothing anyone waits for."""

    verdict: Verdict
    outcomes: list[Outcome]
    request: str = ""
    # The shard every outcome's message is on ("0" on a queue of one shard): a shard whose
    # master is down holds up only its own commits (see QueueConsumer._send_commits).
    shard: str = "0"


def by_shard(outcomes: list[Outcome]) -> dict[str, list[Outcome]]:
    """Outcomes by the shard their message is on, each in its order."""
    shards: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        message_id = outcome.message.id
        # (Most ids of a queue of one shard name none: no need to parse them.)
        name = shard_name(*shard_of(message_id)) if SHARD_MARK in message_id else "0"
        shards.setdefault(name, []).append(outcome)
    return shards


def commit(
    queue: Queue,
    verdict: Verdict,
    outcomes: list[Outcome],
    *,
    fetcher: str = "",
    request: str = "",
) -> bool:
    """Commit outcomes sharing one verdict, then send their signals. True when some message
    was exhausted: its announcement is owed (``announce_exhaustions``), left to the caller
    so that a failure to announce never looks like a failed commit. ``fetcher`` and
    ``request`` name the call, so that a repeat of it is recognised (see ``Commit``)."""
    messages = [outcome.message for outcome in outcomes]
    name = queue.name
    if verdict in (Verdict.NACK, Verdict.BURY):
        # Each refusal's attempt record, written with its verdict.
        attempts = _notes(queue, outcomes)
    if verdict is Verdict.RELEASE:
        queue.release(messages)
        return False
    if verdict is Verdict.ACK:
        acked = queue.ack(messages, fetcher=fetcher, request=request)
        for message in messages:
            if message.id in acked:
                send_robust(signals.message_acked, name, message=message)
            else:
                _log_lost_lease(message, "ack")
        return False
    if verdict is Verdict.NACK:
        # A Retry's or Postpone's own delay, and the postpones (see handling.Outcome).
        delays_ms = {o.message.id: o.delay_ms for o in outcomes if o.delay_ms is not None}
        postponed = {o.message.id for o in outcomes if o.postponed}
        results = {
            r.id: r
            for r in queue.nack(
                messages,
                fetcher=fetcher,
                request=request,
                delays_ms=delays_ms,
                postponed=postponed,
                attempts=attempts,
            )
        }
    else:
        results = {
            r.id: r
            for r in queue.bury(messages, fetcher=fetcher, request=request, attempts=attempts)
        }
    for outcome in outcomes:
        message = outcome.message
        result = results.get(message.id)
        if result is None:
            _log_lost_lease(message, "nack")
            continue
        if result.superseded:
            # Not a retry: the message is gone, a newer one with its key waits.
            logger.info(
                "message id=%s queue=%s attempt=%s not retried: a newer message with its key "
                "waits, so it was removed",
                loggable(message.id),
                name,
                message.attempt,
            )
        send_robust(
            signals.message_nacked,
            name,
            message=message,
            error=outcome.error,
            retry_at_ms=None if result.exhausted or result.superseded else result.at_ms,
            superseded=result.superseded,
            postponed=outcome.postponed,
            dead_reason=result.dead_reason,
        )
    return any(result.exhausted for result in results.values())


def _notes(queue: Queue, outcomes: list[Outcome]) -> dict[str, AttemptNote] | None:
    """The attempt record of each refused outcome (none on a queue that keeps none)."""
    if queue.config.history_attempts == 0:
        return None
    return {
        o.message.id: queue.attempt_note(o.message, o.error, ran_seconds=o.seconds)
        for o in outcomes
    }


def _log_lost_lease(message: Message, what: str) -> None:
    logger.warning(
        "%s of message id=%s queue=%s attempt=%s came after its delivery timed out; "
        "the message is being delivered again",
        what,
        loggable(message.id),
        message.queue,
        message.attempt,
    )


def announce_exhaustions(queue: Queue) -> None:
    """Send ``message_exhausted`` for every exhaustion whose announcement is owed, or
    ``message_expired`` for a message dead-lettered because its expiry passed."""
    while True:
        # Announcing is consumed like a delivery: if this worker dies before confirming,
        # the claim lapses after MAX_CONSUME_DURATION and another worker announces it.
        claims = queue.claim_exhausted(
            EXHAUSTED_CLAIM_BATCH, claim_seconds=queue.config.max_consume_ms / 1000
        )
        for claim in claims:
            if claim.reason == EXPIRED:
                logger.warning(
                    "message expired before it was handed out id=%s queue=%s attempts=%s",
                    loggable(claim.id),
                    claim.queue,
                    claim.attempt,
                )
                send_robust(signals.message_expired, queue.name, message=claim)
                continue
            logger.warning(
                "message exhausted its retries id=%s queue=%s attempts=%s%s",
                loggable(claim.id),
                claim.queue,
                claim.attempt,
                f" ({claim.reason})" if claim.reason else "",
            )
            send_robust(signals.message_exhausted, queue.name, message=claim)
        queue.confirm_exhausted(claims)
        if len(claims) < EXHAUSTED_CLAIM_BATCH:
            return
