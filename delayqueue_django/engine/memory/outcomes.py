"""A memory queue's outcome records, as the scripts keep ``{tag}:ended:<id>`` and
``{tag}:ended_key:<key>`` (see engine.outcomes and "Outcome records" in _prelude.lua): the
same text, written while the message is still stored, and gone when the retention passes,
as Redis expires the keys (nobody sweeps: each write and read forgets those past)."""

from delayqueue_django.engine.memory import key_index
from delayqueue_django.engine.memory.server import QueueState
from delayqueue_django.engine.outcomes import EXPIRED_END, PURGED
from delayqueue_django.engine.records import EXPIRED

# Members of QueueState.ended_ends: an id's record, or a key's.
_ID, _KEY = "i", "k"


def reclaim(state: QueueState, now: int) -> None:
    """Forget every record whose retention has passed (until its end, exclusive, as holds)."""
    for member, _ in state.ended_ends.pop_upto(now, len(state.ended_ends)):
        if member[:1] == _ID:
            state.ended.pop(member[1:], None)
        else:
            state.ended_keys.pop(member[1:], None)


def record_end(
    state: QueueState,
    message_id: str,
    outcome: str,
    *,
    at: int,
    now: int,
    retention_ms: int,
    worker: str = "",
    attempts: int | None = None,
) -> None:
    """Record how ``message_id`` ended, at ``at`` (ms); call while it is still stored. Its
    attempts are its meta record's, unless given. Its key remembers it only if the key still
    names it (forget_keys in _prelude.lua)."""
    reclaim(state, now)
    if attempts is None:
        meta = state.metas.get(message_id)
        attempts = 0 if meta is None else meta.attempt
    key = key_index.key_of(state, message_id)
    size = len(worker.encode("utf-8", "surrogateescape"))
    end = now + retention_ms
    state.ended[message_id] = f"{outcome}:{at}:{attempts}:{size}:{worker}{key or ''}"
    state.ended_ends.add(_ID + message_id, end)
    if key is not None and state.keys.get(key) == message_id:
        state.ended_keys[key] = message_id
        state.ended_ends.add(_KEY + key, end)


def dead_end(state: QueueState, message_id: str, now: int) -> tuple[str, int]:
    """How a dead letter about to be deleted ended, and when: expired at its burial, when its
    expiry buried it; else purged now. Read before it leaves garbage."""
    if state.dead_reasons.get(message_id) == EXPIRED:
        buried = state.garbage.score(message_id)
        return EXPIRED_END, now if buried is None else buried
    return PURGED, now


def read(state: QueueState, now: int, message_id: str | None, key: str | None) -> tuple[str, str]:
    """``(id, record)`` of the message's record, by id or by key; ``("", "")`` when none."""
    reclaim(state, now)
    if key is not None:
        message_id = state.ended_keys.get(key)
    if message_id is None or message_id not in state.ended:
        return "", ""
    return message_id, state.ended[message_id]
