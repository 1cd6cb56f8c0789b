"""Ordered groups in a memory queue, as "Ordered groups" in _prelude.lua keeps them: which
group each grouped message belongs to (numbered in send order), which message holds each
group, and each group's parked messages, kept in pending at ``PARKED`` + their due time so
that no fetch stages them while stats, lists, cancel and reschedule still find them."""

import bisect
from collections.abc import Iterable

from delayqueue_django.engine.memory.server import QueueState

# 2^52, as in _prelude.lua: beyond any due time.
PARKED = 4_503_599_627_370_496


def record(state: QueueState, message_id: str, group: str) -> None:
    """A new grouped message, numbered after the queue's earlier grouped sends."""
    state.group_seq += 1
    state.group_of[message_id] = (state.group_seq, group)


def group_of(state: QueueState, message_id: str) -> str | None:
    entry = state.group_of.get(message_id)
    return None if entry is None else entry[1]


def shown_score(score: int) -> int:
    """A pending score as lists and peeks show it: a parked message's due time."""
    return score - PARKED if score >= PARKED else score


def _pass_on(state: QueueState, group: str) -> str | None:
    """The group's next message still parked becomes its holder, back in pending at its due
    time (stale entries, of messages cancelled or rescheduled meanwhile, are dropped);
    returns its id, or None when none waits and the group is free."""
    parked = state.group_parked.get(group, [])
    while parked:
        due, _, message_id = parked.pop(0)
        score = state.pending.score(message_id)
        if score is not None and score >= PARKED:
            state.group_busy[group] = message_id
            state.pending.add(message_id, due)
            return message_id
    state.group_parked.pop(group, None)
    state.group_busy.pop(group, None)
    return None


def release(state: QueueState, message_id: str) -> None:
    """The message no longer holds its group (acked, buried, cancelled, deleted)."""
    group = group_of(state, message_id)
    if group is not None and state.group_busy.get(group) == message_id:
        _pass_on(state, group)


def leave(state: QueueState, message_id: str) -> None:
    """The message leaves the queue: out of its group's parked ones, its group passed on."""
    entry = state.group_of.get(message_id)
    if entry is None:
        return
    _drop_parked(state, entry[1], message_id)
    release(state, message_id)
    del state.group_of[message_id]


def unpark(state: QueueState, message_id: str) -> None:
    """A parked message leaves its group's parked ones before it moves in pending
    (rescheduled, delivered now, taken out): parked again by a later fetch, it takes its
    place by its new due time, where an entry left behind would keep its old one (Redis
    keeps one entry per message, which the next park moves)."""
    score = state.pending.score(message_id)
    entry = state.group_of.get(message_id)
    if score is not None and score >= PARKED and entry is not None:
        _drop_parked(state, entry[1], message_id)


def _drop_parked(state: QueueState, group: str, message_id: str) -> None:
    parked = state.group_parked.get(group)
    if parked is not None:
        parked[:] = [item for item in parked if item[2] != message_id]


def pass_groups(state: QueueState, due: Iterable[tuple[str, int]]) -> list[str]:
    """fetch's gate (pass_groups in _prelude.lua): of the due ids taken out of pending, in
    order, those that may be staged, then the parked heads of free groups (taken out of
    pending too); the others go back to pending, parked."""
    going: list[str] = []
    holders: dict[str, str | None] = {}
    for message_id, score in due:
        entry = state.group_of.get(message_id)
        if entry is None:
            going.append(message_id)
            continue
        seq, group = entry
        if group not in holders:
            holder = state.group_busy.get(group)
            if holder is not None and holder != message_id and holder not in state.payloads:
                holder = None
            holders[group] = holder
        if holders[group] == message_id:
            going.append(message_id)
        else:
            bisect.insort(state.group_parked.setdefault(group, []), (score, seq, message_id))
            state.pending.add(message_id, PARKED + score)
    for group, holder in holders.items():
        if holder is None:
            head = _pass_on(state, group)
            if head is not None:
                state.pending.remove(head)
                going.append(head)
    return going
