"""How the admin shows a message's attempt records (``Queue.history``, ``last_error``): the
message page's "Attempts" table and the dead letters' "last error" column.

What a record holds came from a handler's exception, or from a write that was not ours: it
is shown escaped (the templates' autoescape), with bytes that are not UTF-8 as ``\\xNN``
escapes (``printable``: a lone surrogate would fail the response's encoding, a 500), and
cut here too, so that a record over the store's bounds (a foreign write, an older release)
still makes a page of bounded size. A damaged record is shown as such, with what could be
read of it."""

from dataclasses import dataclass
from datetime import datetime

from delayqueue_django.engine import printable
from delayqueue_django.engine.records import Attempt

# The store cuts an error's text at 2 KiB and a traceback at 8 KiB (in bytes); a record
# written by anything else is cut here, in characters, a little above those.
SHOWN_ERROR_CHARS = 4 * 1024
SHOWN_TRACEBACK_CHARS = 16 * 1024
# The start of the error's text in the dead letters' column, and the most of its class
# (a handler's class path is far shorter: a longer one is a foreign write's).
COLUMN_ERROR_CHARS = 120
COLUMN_CLASS_CHARS = 256
# A verdict is a word or two (engine.records.VERDICTS); a foreign write's, cut.
VERDICT_CHARS = 64


@dataclass(frozen=True)
class AttemptRow:
    """One row of the Attempts table."""

    attempt: int
    verdict: str
    error_class: str
    error: str
    # The text was cut (by the store at its bound, or here): the page says so.
    error_cut: bool
    # None for a user without the queue's change permission (nor is it in the page).
    traceback: str | None
    has_traceback: bool
    # The traceback keeps its tail: it is the earlier lines that were cut.
    traceback_cut: bool
    worker: str
    ended_at: datetime | None
    seconds: float | None
    # Why the record could not be read in full; "" for a sound one.
    damaged: str


def shown(text: str, limit: int) -> tuple[str, bool]:
    """``text`` fit for a page: printable, and at most ``limit`` characters (the start)."""
    text = printable(text)
    return (text, False) if len(text) <= limit else (text[:limit], True)


def tail(text: str, limit: int) -> tuple[str, bool]:
    """A traceback fit for a page: printable, and its last ``limit`` characters (where the
    exception is)."""
    text = printable(text)
    return (text, False) if len(text) <= limit else (text[-limit:], True)


def attempt_row(record: Attempt, *, with_traceback: bool) -> AttemptRow:
    error, error_cut = shown(record.error, SHOWN_ERROR_CHARS)
    traceback, traceback_cut = tail(record.traceback, SHOWN_TRACEBACK_CHARS)
    seconds = None
    if record.started_at is not None and record.ended_at is not None:
        # (Both on Redis's clock; the start is the worker's estimate, so never below 0.)
        seconds = max((record.ended_at - record.started_at).total_seconds(), 0.0)
    return AttemptRow(
        attempt=record.attempt,
        verdict=shown(record.verdict, VERDICT_CHARS)[0],
        error_class=shown(record.error_class, SHOWN_ERROR_CHARS)[0],
        error=error,
        error_cut=error_cut or record.error_cut,
        traceback=traceback if with_traceback else None,
        has_traceback=bool(record.traceback),
        traceback_cut=traceback_cut or record.traceback_cut,
        worker=shown(record.worker, 200)[0],
        ended_at=record.ended_at,
        seconds=seconds,
        damaged=printable(record.damaged),
    )


def attempt_rows(records: list[Attempt], *, with_traceback: bool) -> list[AttemptRow]:
    """The Attempts table, newest first (history gives them oldest first): the attempt an
    operator looks for is the last one."""
    return [attempt_row(record, with_traceback=with_traceback) for record in reversed(records)]


@dataclass(frozen=True)
class ErrorCell:
    """A dead letter's "last error" cell: its class (its verdict when there was no
    exception) and the start of its text."""

    verdict: str
    error_class: str
    error: str
    cut: bool
    damaged: str


def error_cell(record: Attempt | None) -> ErrorCell | None:
    if record is None:
        return None
    error, cut = shown(record.error, COLUMN_ERROR_CHARS)
    return ErrorCell(
        verdict=shown(record.verdict, VERDICT_CHARS)[0],
        error_class=shown(record.error_class, COLUMN_CLASS_CHARS)[0],
        error=error,
        cut=cut or record.error_cut,
        damaged=printable(record.damaged),
    )
