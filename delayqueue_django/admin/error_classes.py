"""The dead letters by the class of their last error: the filter of the dead letters' list
(which classes there are, how many of each) and the bulk actions on every dead letter of one
class ("requeue" and "delete", after a confirmation page).

A queue may hold millions of dead letters and no index by class: they are read in batches
of BATCH (a listing of each shard's, oldest burial first, then the batch's last errors), so
that every Redis call stays short, and a page reads at most a bounded number of them. On a
sharded queue each shard is read in turn (``parts``), with its own offsets: the merged
listing would read every shard up to each page's end."""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from delayqueue_django.admin.attempts import COLUMN_CLASS_CHARS, VERDICT_CHARS, shown
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import StoredMessage
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.records import Attempt
from delayqueue_django.engine.sharding.store import parts

BATCH = 500
# The choice of the dead letters that have no attempt record (buried by an older release,
# by Queue.bury() before any attempt, or their records gone): no class path is "-".
NO_ERROR = "-"
NO_ERROR_LABEL = "no error recorded"


def error_choice(record: Attempt | None) -> str:
    """The filter's value for a dead letter whose last attempt record is ``record``: its
    error's class, shown as the page shows it; for a refusal without an exception (a
    handler that returned False, a lease that ran out) its verdict in parentheses, which no
    class path has; NO_ERROR for none. Printable, and cut as the column cuts it."""
    if record is None:
        return NO_ERROR
    if record.error_class:
        # Cut as in its column: a class path so long is a foreign write's, and the choice
        # goes into every link of the filter.
        return shown(record.error_class, COLUMN_CLASS_CHARS)[0]
    return f"({shown(record.verdict, VERDICT_CHARS)[0] or 'damaged'})"


def choice_label(choice: str) -> str:
    return NO_ERROR_LABEL if choice == NO_ERROR else choice


@dataclass(frozen=True)
class DeadLetter:
    stored: StoredMessage
    last_error: Attempt | None

    @property
    def choice(self) -> str:
        return error_choice(self.last_error)


def _with_last_errors(store: ShardStore, batch: list[StoredMessage]) -> list[DeadLetter]:
    errors = store.last_errors([entry.id for entry in batch])
    return [DeadLetter(entry, errors.get(entry.id)) for entry in batch]


@dataclass
class Scan:
    """What a scan of the dead letters found: how many it looked at, of which choice, and
    whether it stopped at its limit with dead letters left unread."""

    looked: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    complete: bool = True


def scan(
    queue: Queue,
    *,
    limit: int,
    buried_before_ms: int | None = None,
    each: Callable[[list[DeadLetter]], int] | None = None,
) -> Scan:
    """Read the queue's dead letters, each shard's oldest burial first, at most ``limit`` in
    all, and only those buried before ``buried_before_ms`` if given, counting each choice.
    ``each``, given, is called with every batch and returns how many of it it removed from
    the queue (a bulk action): the shard's next batch starts that many fewer further on."""
    result = Scan()
    for store in parts(queue.store).values():
        offset = 0
        while True:
            room = limit - result.looked
            if room <= 0:
                result.complete = False
                return result
            page = store.list("garbage", offset=offset, limit=min(BATCH, room), preview_bytes=0)
            if buried_before_ms is not None:
                # Oldest first: the first one buried since ends the shard's scan.
                page = [
                    entry
                    for entry in page
                    if entry.score_ms is not None and entry.score_ms < buried_before_ms
                ]
            batch = _with_last_errors(store, page) if page else []
            result.looked += len(batch)
            result.counts.update(letter.choice for letter in batch)
            removed = each(batch) if each is not None and batch else 0
            offset += len(batch) - removed
            if len(batch) < min(BATCH, room):  # the shard's end, or its last one buried before
                break
    return result


@dataclass(frozen=True)
class ErrorFilter:
    """The dead letters' filter by error class, as a page reads it: the choices (value,
    label, count; the commonest first), how many dead letters were read for them, and, with
    a choice made, the dead letters of that choice among them, oldest burial first."""

    chosen: str
    choices: list[tuple[str, str, int]]
    looked: int
    complete: bool
    matches: list[DeadLetter]


def error_filter(queue: Queue, chosen: str, *, limit: int) -> ErrorFilter:
    matches: list[DeadLetter] = []

    def keep(batch: list[DeadLetter]) -> int:
        matches.extend(letter for letter in batch if letter.choice == chosen)
        return 0

    found = scan(queue, limit=limit, each=keep if chosen else None)
    matches.sort(key=lambda letter: letter.stored.score_ms or 0)
    choices = [
        (choice, choice_label(choice), count)
        for choice, count in sorted(found.counts.items(), key=lambda item: (-item[1], item[0]))
    ]
    return ErrorFilter(chosen, choices, found.looked, found.complete, matches)
