"""What the scripts' replies mean: their bytes read as text, ids, stats, flow states, nack
outcomes and stored messages. Shared by ``RedisStore`` and ``AsyncRedisStore``."""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from delayqueue_django.engine.flow import FlowState, parse_rate_wire
from delayqueue_django.engine.keyed import split_keyed
from delayqueue_django.engine.records import (
    EXPIRED,
    POSTPONED_TOO_OFTEN,
    NackOutcome,
    StoredMessage,
    meta_numbers,
    split_trace,
)

# Replies are bytes. What the package wrote itself is UTF-8 text; but anyone can write to a
# queue's keys, and bytes that are not UTF-8 in an id, payload or meta record must cost that
# message alone, never the reader (a fetch's whole batch, an admin page).


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _flow_state(paused: int, rate_text: bytes | str) -> FlowState:
    """The flow state as flow.lua and add_layout.lua answer it."""
    return FlowState(bool(int(paused)), parse_rate_wire(_text(rate_text)))


def _id(value: bytes | str) -> str:
    """An id as stored: bytes that are not UTF-8 become surrogate escapes (see keyed_calls.wire)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _shown(value: bytes | str) -> str:
    """Text to look at: bytes that are not UTF-8 as backslash escapes ("\\xff")."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _optional_shown(value: bytes | str | None) -> str | None:
    return None if value is None else _shown(value)


def _payload_text(value: bytes | str | None) -> str | None:
    """A payload's text; None if it is missing or not UTF-8 text."""
    try:
        return None if value is None else _text(value)
    except UnicodeDecodeError:
        return None


def parse_meta(raw: str | None) -> tuple[int, int, int] | None:
    """Lease, attempt and budget from ``"lease:attempt:budget:due"``, or None when the
    record is missing or damaged. (A record from before ``due`` was kept has 3 fields.)"""
    if raw is None:
        return None
    parts = raw.split(":")
    numbers = meta_numbers(parts) if len(parts) in (3, 4) else None
    if numbers is None:
        return None
    lease, attempt, budget = numbers[:3]
    return lease, attempt, budget


# nack.lua's codes of a burial, by the reason they give it.
_BURIAL_REASONS = {2: "", 4: EXPIRED, 5: POSTPONED_TOO_OFTEN}


def nack_outcomes(flat: Sequence[Any]) -> list[NackOutcome]:
    """nack.lua's outcomes (id, code, time per refusal) as NackOutcome."""
    outcomes = []
    for i in range(0, len(flat), 3):
        code = int(flat[i + 1])
        outcomes.append(
            NackOutcome(
                _id(flat[i]),
                code in _BURIAL_REASONS,
                int(flat[i + 2]),
                superseded=code == 3,
                dead_reason=_BURIAL_REASONS.get(code, ""),
            )
        )
    return outcomes


def removed_state(reply: Sequence[Any]) -> str | None:
    return _text(reply[0]) or None


STATS_NAMES = (
    *("pending", "ready", "unack", "retry", "garbage", "due", "unannounced"),
    *("server_time_ms", "next_due_ms", "lag_ms"),
    # Running totals since the queue began (they add up across workers).
    *("acked_total", "failed_total", "retried_total", "timed_out_total", "exhausted_total"),
    "superseded_total",
    *("expired_total", "postponed_total"),
    # 1 while the queue is paused (flow gates).
    "paused",
)


def parse_stats(reply: Sequence[Any]) -> dict[str, int]:
    return {name: int(value) for name, value in zip(STATS_NAMES, reply[:-1], strict=True)}


def _text_dict(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(name): _text(value) for name, value in raw.items()}


def described(message_id: bytes | str, reply: Sequence[Any]) -> StoredMessage | None:
    """peek.lua's reply (lookup.lua's after the id) as a StoredMessage, or None when the
    queue does not know the message. (AsyncRedisStore reads lookup's with it too.)"""
    state, score, payload, size, meta, unannounced, group, reason = reply[:8]
    state = _text(state)
    if not state and payload is None and meta is None:
        return None
    stored = _stored(message_id, state or "unknown", score, payload, size, meta, bool(unannounced))
    stored = replace(stored, group=_optional_shown(group))
    return replace(stored, dead_reason=_shown(reason)) if reason else stored


def _stored(
    message_id: bytes | str,
    state: str,
    score: int,
    payload: bytes | str | None,
    size: int,
    meta: bytes | str | None,
    unannounced: bool,
) -> StoredMessage:
    parsed = parse_meta(_optional_shown(meta))
    lease, attempt, budget = parsed if parsed else (None, None, None)
    shown = _optional_shown(payload)
    key, generation = None, 0
    if shown is not None:
        key, generation, shown = split_keyed(shown)
    return StoredMessage(
        id=_id(message_id),
        state=state,
        score_ms=None if int(score) < 0 else int(score),
        # Without the trace context a traced send put before it (see tracing.py).
        payload=None if shown is None else split_trace(shown)[1],
        payload_size=int(size),
        lease=lease,
        attempt=attempt,
        budget=budget,
        unannounced=unannounced,
        key=key,
        generation=generation,
    )
