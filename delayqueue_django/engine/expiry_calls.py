"""Expiry and postpones on the wire (see "Expiry and postpones" in _prelude.lua): the
arguments send.lua, send_keyed.lua and nack.lua take after their messages. A call that uses
neither sends exactly what it sent before they existed."""

from collections.abc import Collection, Sequence
from typing import Any

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


def postpone_args(
    refused_ids: Collection[str], postponed: Collection[str], max_postpones: int
) -> list[Any]:
    """nack.lua's postpones, after its refusals: the bound, a count, then the ids (of this
    call's refusals) that are postponed. Empty when none is."""
    ids = [message_id for message_id in postponed if message_id in refused_ids]
    return [max_postpones, len(ids), *ids] if ids else []
