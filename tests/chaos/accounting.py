"""Counting what a chaos run lost and duplicated, from what producers had acknowledged and
what the workers' ledger recorded."""

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from redis.exceptions import RedisError

from delayqueue_django.core.queue import Queue
from tests.chaos.ledger import Entry

WAITING_STATES = ("pending", "ready", "unack", "retry")


@dataclass(frozen=True)
class Tally:
    handled: Counter[str]  # id -> how many times a handler finished it
    lost: list[str]  # acknowledged by send, never handled (nor rejected by the handler)
    duplicates: int  # handler runs beyond the first, per message
    unacknowledged: set[str]  # handled, though the send that wrote it raised


def tally(sent: Iterable[str], entries: Iterable[Entry]) -> Tally:
    entries = list(entries)
    handled = Counter(entry.id for entry in entries if entry.event == "done")
    rejected = {entry.id for entry in entries if entry.event == "rejected"}
    sent = set(sent)
    return Tally(
        handled=handled,
        lost=sorted(i for i in sent if i not in handled and i not in rejected),
        duplicates=sum(count - 1 for count in handled.values()),
        unacknowledged=set(handled) - sent,
    )


def lost_outside_windows(
    tally: Tally, sent: Mapping[str, float], faults: Iterable[tuple[float, float]], window: float
) -> list[str]:
    """Lost messages that were not acknowledged within ``window`` seconds before one of
    the ``faults`` (start, end): the losses the design does not allow."""
    starts = [start for start, _ in faults]
    return [
        message_id
        for message_id in tally.lost
        if not any(start - window <= sent[message_id] <= start for start in starts)
    ]


def first_handled_after(moment: float, sent: Mapping[str, float], entries: list[Entry]) -> float:
    """Seconds from ``moment`` until a message sent after it was handled: end-to-end recovery
    (the producer sends again, a worker fetches and handles)."""
    later = {message_id for message_id, at in sent.items() if at >= moment}
    for entry in entries:
        if entry.event == "done" and entry.id in later:
            return entry.time - moment
    raise AssertionError(f"nothing sent after {moment} was handled")


def drain(queue: Queue, timeout: float) -> float:
    """Wait until nothing waits in the queue any more (pending, staged or in flight): every
    message still known was handled, nothing is stuck. Returns the seconds it took."""
    started = time.monotonic()
    stats = None
    while time.monotonic() - started < timeout:
        try:
            stats = queue.stats()
        except RedisError:  # the queue's Redis may still be coming back
            stats = None
        if stats is not None and not any(stats[state] for state in WAITING_STATES):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"the queue did not drain within {timeout}s: {stats}")
