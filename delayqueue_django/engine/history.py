"""Attempt records on the wire and in Redis (see "Attempt records" in _prelude.lua): the
note a worker sends with a refusal, and the packed records read back as ``Attempt``s.

A message's records are one field of the hash ``<tag>:history``: its id -> a JSON array of
records, oldest first, each an array
``[attempt, verdict, error_class, error, traceback, worker, started_ms, ended_ms, cut]``
(``started_ms`` null when not known; ``cut`` "e" and/or "t" when the text or the traceback
was cut). Reading never raises: whatever is damaged reads as an ``Attempt`` whose
``damaged`` says why.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayqueue_django.engine.records import LARGEST_META_NUMBER, Attempt, moment_of_ms

# Bounds of what one record keeps (bytes of UTF-8): the text's start, the traceback's tail.
ERROR_BYTES = 2 * 1024
TRACEBACK_BYTES = 8 * 1024
# The most records a message may keep (HISTORY_ATTEMPTS is checked against it).
MOST_ATTEMPTS = 100
# The fields of a record, in order.
FIELDS = 9


@dataclass(frozen=True, slots=True)
class AttemptNote:
    """What a worker knows of a refused attempt, sent with its verdict: the script adds the
    attempt number and its clock's now (and may change the verdict, see nack.lua)."""

    verdict: str
    error_class: str = ""
    error: str = ""
    traceback: str = ""
    worker: str = ""
    # How long before the verdict's call the handler started (ms); None when not known.
    started_ago_ms: int | None = None
    error_cut: bool = False
    traceback_cut: bool = False

    def wire(self, message_id: str) -> list[Any]:
        """The note as nack.lua takes it: 8 arguments."""
        cut = ("e" if self.error_cut else "") + ("t" if self.traceback_cut else "")
        ago = "" if self.started_ago_ms is None else max(int(self.started_ago_ms), 0)
        return [
            message_id,
            self.verdict,
            _sendable(self.error_class),
            _sendable(self.error),
            _sendable(self.traceback),
            _sendable(self.worker),
            ago,
            cut,
        ]

    def record(self, attempt: int, verdict: str, now_ms: int) -> list[Any]:
        """The record nack.lua writes of this note (the memory store writes the same)."""
        cut = ("e" if self.error_cut else "") + ("t" if self.traceback_cut else "")
        ago = None if self.started_ago_ms is None else max(int(self.started_ago_ms), 0)
        texts = (self.error_class, self.error, self.traceback, self.worker)
        return [
            attempt,
            verdict,
            *(_sendable(text).decode("utf-8") for text in texts),
            None if ago is None else now_ms - ago,
            now_ms,
            cut,
        ]


def pack(records: list[list[Any]]) -> str:
    """A message's records as the history hash holds them (as cjson writes them, but for
    its escaping of "/")."""
    return json.dumps(records, ensure_ascii=False, separators=(",", ":"))


def appended(raw: str | None, record: list[Any], bound: int) -> str:
    """A message's packed records with ``record`` added, the oldest dropped past
    ``bound``; a value that is not a list of records (a foreign write) is replaced."""
    if raw is None:  # (the usual case: a message's first record)
        return pack([record])
    try:
        records = json.loads(raw)
    except (ValueError, RecursionError):
        records = []
    if not isinstance(records, list):
        records = []
    records.append(record)
    return pack(records[-bound:])


def _sendable(text: str) -> bytes:
    """Text as UTF-8, a lone surrogate (an exception's text may hold one) escaped."""
    return text.encode("utf-8", "backslashreplace")


def cut_head(text: str, limit: int) -> tuple[str, bool]:
    """The start of ``text`` in at most ``limit`` bytes of UTF-8, never half a character;
    and whether it was cut."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= limit:
        return raw.decode("utf-8"), False
    return raw[:limit].decode("utf-8", "ignore"), True


def cut_tail(text: str, limit: int) -> tuple[str, bool]:
    """The end of ``text`` in at most ``limit`` bytes of UTF-8, never half a character
    (a traceback's last lines say where it failed); and whether it was cut."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= limit:
        return raw.decode("utf-8"), False
    return raw[len(raw) - limit :].decode("utf-8", "ignore"), True


def parse_history(raw: bytes | str | None) -> list[Attempt]:
    """A message's records as the hash holds them, oldest first; [] when it has none."""
    if raw is None:
        return []
    # Bytes that are not UTF-8 (a foreign write) stay apart as surrogate escapes: only the
    # records holding them read as damaged.
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "surrogateescape")
    try:
        records = json.loads(text)
    except (ValueError, RecursionError):
        return [Attempt(0, "", damaged="unreadable: not the JSON of attempt records")]
    if not isinstance(records, list):
        return [Attempt(0, "", damaged="unreadable: not a list of attempt records")]
    return [_attempt(record) for record in records]


def last_of(raw: bytes | str | None) -> Attempt | None:
    """The newest record of a message's, or None when it has none."""
    records = parse_history(raw)
    return records[-1] if records else None


def foreign(kind: str) -> Attempt:
    """What a read of a history key of another type shows."""
    return Attempt(0, "", damaged=f"the history key holds a {kind}, not a hash")


def _utf8(value: Any) -> tuple[Any, bool]:
    """A field as read: text with bytes that were not UTF-8 shown as U+FFFD, and whether
    it had any."""
    if not isinstance(value, str) or value.isascii():
        return value, False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True
    return value, False


def _attempt(record: Any) -> Attempt:
    if not isinstance(record, list):
        return Attempt(0, "", damaged="unreadable: not an attempt record")
    read = [_utf8(value) for value in [*record[:FIELDS], *[None] * (FIELDS - len(record))]]
    fields = [value for value, _ in read]
    problems = ["not UTF-8: shown with replacement characters"] if any(b for _, b in read) else []
    if len(record) < FIELDS:
        problems.append(f"missing fields: {FIELDS - len(record)} of {FIELDS}")
    attempt = _number(fields[0])
    if attempt is None and fields[0] is not None:
        problems.append("attempt is not a number")
    texts = [_string(value) for value in fields[1:6]]
    if any(
        value is not None and text is None for value, text in zip(fields[1:6], texts, strict=True)
    ):
        problems.append("a text field is not text")
    started, ended = _time(fields[6]), _time(fields[7])
    if (started is None and fields[6] is not None) or (ended is None and fields[7] is not None):
        problems.append("a time is not a time")
    cut = fields[8] if isinstance(fields[8], str) else ""
    verdict, error_class, error, traceback, worker = (text or "" for text in texts)
    return Attempt(
        attempt or 0,
        verdict,
        error_class,
        error,
        traceback,
        worker,
        started,
        ended,
        "e" in cut,
        "t" in cut,
        "; ".join(problems),
    )


def _number(value: Any) -> int | None:
    # (cjson writes whole numbers as such; a float is taken only when it is one.)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != int(value) or not 0 <= value <= LARGEST_META_NUMBER:
        return None
    return int(value)


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _time(value: Any) -> datetime | None:
    ms = _number(value)
    return None if ms is None else moment_of_ms(ms)
