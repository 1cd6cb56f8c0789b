"""Expiry and postpones on a memory queue's state, as the scripts' prelude does them (see
"Expiry and postpones" in _prelude.lua): a message is never handed out at or after its
expiry; such a message, and one postponed too often, is a dead letter with its reason,
announced like an exhausted one."""

from collections.abc import Sequence

from delayqueue_django.engine.errors import expiry_refusal
from delayqueue_django.engine.memory import groups
from delayqueue_django.engine.memory.server import QueueState
from delayqueue_django.engine.records import NewMessage


def due_after(now: int, now_us: int, delay_ms: int, delay_us: int) -> int:
    """prelude.due_after (repeated here: the prelude imports this module's users)."""
    if delay_ms == 0 and delay_us == 0:
        return now
    return now + delay_ms + -(-(now_us + delay_us) // 1000)


def expiry_of(message: NewMessage, now: int, now_us: int) -> int | None:
    """When a message sent now expires (ms), or None (read_expiries in the prelude)."""
    if message.expires_at_ms is not None:
        return message.expires_at_ms
    if message.expires_in_us > 0:
        return due_after(now, now_us, *divmod(message.expires_in_us, 1000))
    return None


def refuse_early_expiries(
    batch: Sequence[NewMessage], dues: Sequence[int | None], now: int, now_us: int, queue: str
) -> list[int | None]:
    """Each message's expiry; raises InvalidExpiry, before anything is written, for the first
    whose expiry is not after its due time (None: a replay, not written)."""
    expiries = []
    for message, due in zip(batch, dues, strict=True):
        expiry = expiry_of(message, now, now_us)
        if expiry is not None and due is not None and expiry <= due:
            refusal = expiry_refusal(f"EXPIRES_BEFORE_DUE {message.id}", queue)
            assert refusal is not None
            raise refusal
        expiries.append(expiry)
    return expiries


def set_expiry(state: QueueState, message_id: str, expiry: int | None) -> None:
    if expiry is None:
        state.expiries.pop(message_id, None)
    else:
        state.expiries[message_id] = expiry


def expired(state: QueueState, message_id: str, at: int) -> bool:
    """Whether the message's expiry is at or before ``at``."""
    expiry = state.expiries.get(message_id)
    return expiry is not None and expiry <= at


def bury_for(state: QueueState, message_id: str, now: int, reason: str, total: str) -> None:
    """A dead letter with its reason, announced like an exhausted one (bury_for)."""
    state.garbage.add(message_id, now)
    state.exhausted.add(message_id, now)
    state.dead_reasons[message_id] = reason
    state.expiries.pop(message_id, None)
    state.totals[total] = state.totals.get(total, 0) + 1
    groups.release(state, message_id)  # a dead letter passes its ordered group on


def forget_flow(state: QueueState, message_id: str) -> None:
    """A message leaving, or starting a new life: its expiry, postpones, dead reason and
    attempt records."""
    state.expiries.pop(message_id, None)
    state.postpones.pop(message_id, None)
    state.dead_reasons.pop(message_id, None)
    state.history.pop(message_id, None)
