"""Expiry and postpones on the wire (see "Expiry and postpones" in _prelude.lua): the
arguments send.lua, send_keyed.lua and nack.lua take after their messages (nack.lua's
attempt records too, see engine.history). A call that uses
neither sends exactly what it sent before they existed."""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from delayqueue_django.engine.history import AttemptNote
from delayqueue_django.engine.records import NewMessage


def expiry_args(chunk: Sequence[NewMessage]) -> list[Any]:
    """The expiries of a send's chunk, after its messages: a count, then per message that
    expires its place in the chunk (from 1), its at_ms (or "") and its in_us. Empty when
    none expires."""
    args: list[Any] = []
    for place, message in enumerate(chunk, start=1):
        if message.expires:
            at = "" if message.expires_at_ms is None else message.expires_at_ms
            args += [place, at, message.expires_in_us]
    return [len(args) // 3, *args] if args else []


def refusal_args(
    refused_ids: Collection[str],
    postponed: Collection[str],
    max_postpones: int,
    attempts: Mapping[str, AttemptNote] | None,
    history_attempts: int,
) -> list[Any]:
    """nack.lua's arguments after its refusals: the postpones (the bound, a count, then the
    ids of this call's refusals that are postponed), then the attempt records (their bound,
    a count, then a note of 8 per refused id that has one). Empty when there are neither;
    the postpones "0", "0" when there are records and no postpone."""
    ids = [message_id for message_id in postponed if message_id in refused_ids]
    notes: list[Any] = []
    if attempts and history_attempts > 0:
        for message_id in refused_ids:
            note = attempts.get(message_id)
            if note is not None:
                notes += note.wire(message_id)
    if not notes:
        return [max_postpones, len(ids), *ids] if ids else []
    return [max_postpones, len(ids), *ids, history_attempts, len(notes) // 8, *notes]
