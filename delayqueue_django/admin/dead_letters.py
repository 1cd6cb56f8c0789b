"""Why a dead letter died, in words, from what the queue keeps of it: its dead reason when
that is not the default, else its attempts against its retry budget, which tell a message
whose retries were used up from one buried before (a Reject buries at once), and what its
last attempt's record says of how that attempt ended. What each attempt raised is in the
message page's Attempts table (admin.attempts)."""

from django.template.defaultfilters import date as format_date

from delayqueue_django.admin.attempts import COLUMN_CLASS_CHARS, shown
from delayqueue_django.admin.display import as_datetime
from delayqueue_django.engine import EXPIRED, POSTPONED_TOO_OFTEN, StoredMessage
from delayqueue_django.engine.records import (
    ERROR,
    LEASE_EXPIRED,
    NACK,
    REJECT,
    RETRY,
    TIME_LIMIT,
    Attempt,
)

# As every time on the admin's pages (see docs/guides/admin.md).
TIME_FORMAT = "Y-m-d H:i:s T"


def why_it_died(stored: StoredMessage) -> str:
    """What the page says of a dead letter (``stored`` as peek reads it)."""
    if stored.dead_reason == EXPIRED:
        # Buried by a fetch that found its expiry passed, or by the nack whose retry would
        # have come at or after it: either way its burial time is when.
        when = format_date(as_datetime(stored.score_ms), TIME_FORMAT) or "an unknown time"
        return (
            f"expired: dead-lettered at {when}, when its expiry had passed before it could be "
            "delivered (or tried again). A requeue runs it without its expiry."
        )
    if stored.dead_reason == POSTPONED_TOO_OFTEN:
        return "postponed too often: one postpone more than the queue's MAX_POSTPONES"
    if stored.dead_reason:  # (a reason of a later release, or a foreign write)
        return stored.dead_reason
    if stored.payload is None:
        return "its payload is missing: such a message cannot be delivered, and is set aside"
    attempt, budget, left = stored.attempt, stored.budget, stored.retries_left
    if attempt is None or budget is None or left is None:
        return "not known: its delivery record is missing (a damaged message is set aside)"
    if attempt == 0:
        return "never delivered: set aside as damaged (the workers' log says why)"
    # What its last attempt's record says of it, when that is the attempt that buried it.
    last = stored.last_error
    how = _how(last) if last is not None and last.attempt == attempt else ""
    if left == 0:
        tries = "the first, with no retry" if budget == 0 else f"the first and {budget} retr"
        tries += "" if budget == 0 else ("y" if budget == 1 else "ies")
        return f"retries used up: attempt {attempt} was its last ({tries}); " + (
            f"{how} (see Attempts)" if how else "it failed, timed out or was rejected"
        )
    return f"rejected on attempt {attempt}, with {left} of its {budget} retries left: " + (
        f"{how} (see Attempts)"
        if how
        else "its handler raised Reject, its payload could not be decoded, or Queue.bury() "
        "buried it"
    )


def _how(last: Attempt) -> str:
    """How the attempt that buried a dead letter ended, from its record; "" when the record
    does not say more than the attempts do."""
    error_class = shown(last.error_class, COLUMN_CLASS_CHARS)[0]
    if last.verdict == ERROR:
        return f"its handler raised {error_class}" if error_class else ""
    if last.verdict == REJECT:
        # (Queue.bury() records a reject with no error: that says no more than the attempts.)
        return f"it was rejected ({error_class})" if error_class else ""
    return _HOW.get(last.verdict, "")


# The other verdicts in words (engine.records' verdicts).
_HOW = {
    RETRY: "its handler raised Retry",
    NACK: "its handler returned False",
    TIME_LIMIT: "it ran past its TIME_LIMIT",
    LEASE_EXPIRED: "no verdict came before its lease ran out (its worker stopped or died)",
}
