"""The prelude's helpers (``engine/lua/_prelude.lua``) on a memory queue's state: what the
scripts share (due times, taking a message out of its state, burying, counting, a
schedule's record), for the memory store's operations to share in the same way."""

from collections import deque

from delayqueue_django.engine.keyed import split_keyed
from delayqueue_django.engine.memory import groups, metrics
from delayqueue_django.engine.memory.expiry import forget_flow
from delayqueue_django.engine.memory.key_index import drop_pointer
from delayqueue_django.engine.memory.server import (
    Meta,
    QueueState,
    TickRecord,
)
from delayqueue_django.engine.metrics import Counts
from delayqueue_django.engine.records import (
    Delivery,
    ScheduleRecord,
    ScheduleReply,
    StoredMessage,
    split_trace,
    tick_id,
)


def due_after(now: int, now_us: int, delay_ms: int, delay_us: int) -> int:
    """When a delay from the clock reading (now, now_us) runs out, in whole ms, rounded up:
    nothing is handed out before its time. No delay at all is due at ``now`` itself."""
    if delay_ms == 0 and delay_us == 0:
        return now
    return now + delay_ms + -(-(now_us + delay_us) // 1000)


def replayed_due(state: QueueState, message_id: str, now: int) -> int:
    """A replayed send's due time: its pending score, else when it last became due (it is
    staged, in flight or dead), else now (send.lua)."""
    score = state.pending.score(message_id)
    if score is not None:
        return score
    meta = state.metas.get(message_id)
    return meta.due if meta is not None and meta.due > 0 else now


def take_out(state: QueueState, message_id: str) -> bool:
    """Take out a tick if it was never handed out; True if it was (schedule.lua)."""
    meta = state.metas.get(message_id)
    if (meta is None or meta.attempt == 0) and (
        state.pending.remove(message_id) or remove_first(state.ready, message_id)
    ):
        forget(state, message_id)
        return True
    return False


def drop_waiting_tick(state: QueueState, name: str, record: TickRecord, *, due_too: bool) -> int:
    """Take out the tick the schedule waits on if it was never handed out (with ``due_too``,
    the one before it as well, which may still wait behind a backlog); else return the time
    of the tick that fired, the floor of the cursor (schedule.lua)."""
    if record.tick == 0:
        return 0
    if due_too and record.previous > 0:
        take_out(state, tick_id(name, record.previous))
    if take_out(state, tick_id(name, record.tick)):
        record.tick = 0
        return 0
    fired = record.tick
    record.previous, record.tick = record.tick, 0
    return fired


def remove_schedule(state: QueueState, name: str, record: TickRecord | None) -> None:
    """A schedule and its waiting tick (with the one before, if it still waits) removed
    (schedule.lua's remove)."""
    if record is not None:
        drop_waiting_tick(state, name, record, due_too=True)
    state.schedules.pop(name, None)
    state.schedule_ticks.pop(name, None)
    state.schedule_failures.pop(name, None)
    state.schedule_declared.pop(name, None)


def schedule_record(state: QueueState, name: str) -> ScheduleRecord:
    record = state.schedule_ticks.get(name)
    definition = state.schedules.get(name)
    if record is None:
        return ScheduleRecord(name, definition, None)
    return ScheduleRecord(
        name,
        definition,
        record.fingerprint,
        record.paused,
        record.cursor,
        record.tick,
        record.previous,
        state.schedule_failures.get(name),
        record.since,
    )


def schedule_reply(status: str, record: TickRecord | None, now: int) -> ScheduleReply:
    if record is None:
        return ScheduleReply(status, 0, 0, 0, now)
    return ScheduleReply(status, record.cursor, record.tick, record.previous, now)


def holds(state: QueueState, message_id: str, lease: int) -> bool:
    """The delivery is still in flight under this very lease (see ack.lua)."""
    meta = state.metas.get(message_id)
    return meta is not None and meta.lease == lease and message_id in state.unack


def bury(state: QueueState, message_id: str, now: int) -> None:
    """Retries used up: a dead letter whose exhaustion is still to be announced."""
    state.garbage.add(message_id, now)
    state.exhausted.add(message_id, now)
    count_total(state, "exhausted", 1)
    metrics.count_minute(state, now, Counts(dead=1))
    # A buried holder passes its group on; its entry stays, for a requeue to wait again.
    groups.release(state, message_id)


def delivery(state: QueueState, message_id: str, meta: Meta, deadline: int) -> Delivery:
    key, generation, payload = split_keyed(state.payloads[message_id])
    return Delivery(
        id=message_id,
        payload=payload,
        attempt=meta.attempt,
        lease=meta.lease,
        budget=meta.budget,
        deadline_ms=deadline,
        due_ms=meta.due,
        key=key,
        generation=generation,
        group=groups.group_of(state, message_id),
    )


def forget(state: QueueState, message_id: str) -> None:
    """The message leaves storage, and its key's pointer with it if that names it."""
    drop_pointer(state, message_id)
    groups.leave(state, message_id)
    state.payloads.pop(message_id, None)
    state.metas.pop(message_id, None)
    state.exhausted.remove(message_id)
    forget_flow(state, message_id)


def count_total(state: QueueState, what: str, n: int) -> None:
    if n > 0:
        state.totals[what] = state.totals.get(what, 0) + n


def remove_first(staged: deque[str], message_id: str) -> bool:
    """LREM list 1 id."""
    try:
        staged.remove(message_id)
    except ValueError:
        return False
    return True


def take_out_of_waiting(state: QueueState, message_id: str) -> bool:
    """Take a message out of pending, ready or retry; True if it was in one of them."""
    groups.unpark(state, message_id)
    return (
        state.pending.remove(message_id)
        or remove_first(state.ready, message_id)
        or remove_first(state.retry, message_id)
    )


def staged_slice(staged: deque[str], offset: int, limit: int) -> list[str]:
    return [staged[i] for i in range(offset, min(offset + limit, len(staged)))]


def stored(
    state: QueueState,
    message_id: str,
    where: str,
    score: int | None,
    *,
    preview_bytes: int | None = None,
    peeked: bool = False,
) -> StoredMessage:
    """What list.lua (a preview of the payload) or peek.lua (all of it or a preview, and
    whether an exhaustion is still to be announced) return about one message. A keyed
    message's key is split off first: the size and the preview are of its payload."""
    key, generation, payload = None, 0, state.payloads.get(message_id)
    if payload is not None:
        key, generation, payload = split_keyed(payload)
    size = 0 if payload is None else len(payload.encode("utf-8"))
    if payload is not None and preview_bytes is not None and size > preview_bytes:
        # Cut on a character boundary, as list.lua does, so the preview is still valid text.
        payload = payload.encode("utf-8")[:preview_bytes].decode("utf-8", "ignore")
    meta = state.metas.get(message_id)
    return StoredMessage(
        id=message_id,
        state=where,
        score_ms=None if score is None else groups.shown_score(score),
        # Without the trace context a traced send put before it (see tracing.py).
        payload=None if payload is None else split_trace(payload)[1],
        payload_size=size,
        lease=None if meta is None else meta.lease,
        attempt=None if meta is None else meta.attempt,
        budget=None if meta is None else meta.budget,
        unannounced=peeked and message_id in state.exhausted,
        key=key,
        generation=generation,
        group=groups.group_of(state, message_id),
        dead_reason=state.dead_reasons.get(message_id, "") if where == "garbage" else "",
    )


def peek(state: QueueState, message_id: str, preview_bytes: int | None) -> StoredMessage | None:
    """Where a message is and what it holds (peek.lua), or None if the queue does not know it."""
    for name, scored in (
        ("pending", state.pending),
        ("unack", state.unack),
        ("garbage", state.garbage),
    ):
        score = scored.score(message_id)
        if score is not None:
            return stored(state, message_id, name, score, peeked=True, preview_bytes=preview_bytes)
    for name, staged in (("ready", state.ready), ("retry", state.retry)):
        if message_id in staged:
            return stored(state, message_id, name, None, peeked=True, preview_bytes=preview_bytes)
    if message_id in state.payloads or message_id in state.metas:
        return stored(state, message_id, "unknown", None, peeked=True, preview_bytes=preview_bytes)
    return None
