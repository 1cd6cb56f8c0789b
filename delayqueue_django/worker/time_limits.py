"""TIME_LIMIT's hard stop, done by the supervisor (``run_delayqueue --processes`` with
``--concurrency 1``): the worker process whose handler ran past its queue's limit is killed,
that delivery is refused as a failed attempt (retried or dead-lettered as any failure), and
what the process had fetched without starting is handed back at once rather than left to
its lease. Both carry the leases the process reported, so a verdict it committed itself
meanwhile wins: Redis ignores the stale one."""

import logging
from collections import defaultdict

from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.core.message import Message
from delayqueue_django.engine import loggable
from delayqueue_django.exceptions import DelayQueueError, TimeLimitExceeded
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.handling import Outcome, Verdict

logger = logging.getLogger("delayqueue_django.worker")


def refuse_over_time(message: Message, limit: float, ran: float) -> None:
    """Commit the failed attempt of a delivery whose process was killed for running past
    ``limit``; ``message_nacked`` (and ``message_exhausted`` if no retry is left) say so."""
    queue = registry.get_queue(message.queue)
    outcome = Outcome(
        message,
        Verdict.NACK,
        TimeLimitExceeded(f"time limit: the handler ran past TIME_LIMIT ({limit:g} s)"),
        ran,
    )
    try:
        owed = verdicts.commit(queue, Verdict.NACK, [outcome])
        if owed:
            verdicts.announce_exhaustions(queue)
    except (RedisError, DelayQueueError) as error:
        logger.warning(
            "could not refuse message id=%s queue=%s after its time limit (%s); it comes "
            "back after its lease (MAX_CONSUME_DURATION)",
            loggable(message.id),
            message.queue,
            error,
        )


def hand_back(messages: list[Message]) -> None:
    """Release the messages a killed process had fetched and not started (no attempt used)."""
    by_queue: dict[str, list[Message]] = defaultdict(list)
    for message in messages:
        by_queue[message.queue].append(message)
    for name, held in by_queue.items():
        try:
            registry.get_queue(name).release(held)
        except (RedisError, DelayQueueError) as error:
            logger.warning(
                "could not hand back %d messages of queue=%s (%s); they come back after "
                "their lease",
                len(held),
                name,
                error,
            )
