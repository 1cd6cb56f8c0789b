"""A memory queue's key index, unique_for holds and the outbox rows remembered per key, as
the scripts keep ``{tag}:keys``, ``{tag}:hold:<key>`` and ``{tag}:key_rows`` (see
engine/keyed.py and the keys design): which message is each key's, when a message leaving
storage takes its key's pointer with it, whether a keyed message that would return to
waiting is superseded by a newer one, and whether a relayed replace comes after a newer row
of its database (see "Outbox rows" in _prelude.lua).

A keyed message carries its key in its stored body (``keyed.keyed_body``), so the key of any
stored message is read from it; an unkeyed body costs one character test."""

from delayqueue_django.engine.keyed import KEY_MARK, split_keyed
from delayqueue_django.engine.memory import groups
from delayqueue_django.engine.memory.expiry import forget_flow
from delayqueue_django.engine.memory.server import QueueState


def key_of(state: QueueState, message_id: str) -> str | None:
    """The key a stored message was sent with, None if it has none (or is not stored)."""
    body = state.payloads.get(message_id)
    if body is None or body[:1] != KEY_MARK:
        return None
    return split_keyed(body)[0]


def is_waiting(state: QueueState, message_id: str) -> bool:
    """Stored and neither in flight nor dead: pending, staged, or waiting for its retry."""
    return (
        message_id in state.payloads
        and message_id not in state.unack
        and message_id not in state.garbage
    )


def waiting_message(state: QueueState, key: str) -> str | None:
    """The key's message if it is waiting, else None."""
    message_id = state.keys.get(key)
    return message_id if message_id is not None and is_waiting(state, message_id) else None


def drop_pointer(state: QueueState, message_id: str) -> None:
    """The message leaves storage: its key stops naming it (only if it still does: a newer
    message may have the key by now). Call while its payload is still there."""
    key = key_of(state, message_id)
    if key is not None and state.keys.get(key) == message_id:
        del state.keys[key]
        state.key_rows.pop(key, None)


def superseded(state: QueueState, message_id: str) -> bool:
    """A keyed message about to return to waiting (a retry, a release, a timeout, a requeue)
    is superseded when another waiting message is its key's message: that newer one carries
    the key's work, and at most one message per key may wait."""
    key = key_of(state, message_id)
    if key is None:
        return False
    current = waiting_message(state, key)
    return current is not None and current != message_id


def return_to_waiting(state: QueueState, message_id: str) -> bool:
    """Decide for a message taken out of unack that would wait again: True when it may (it
    becomes its key's message again, if it has a key; the caller puts it back in its list);
    False when it is superseded, and then removed here, counted as ``superseded``: one that
    held its ordered group passes it on (remove_superseded in _prelude.lua)."""
    if superseded(state, message_id):
        # Its key names the other, waiting message: no pointer to drop.
        groups.leave(state, message_id)
        state.payloads.pop(message_id, None)
        state.metas.pop(message_id, None)
        state.exhausted.remove(message_id)
        forget_flow(state, message_id)
        state.totals["superseded"] = state.totals.get("superseded", 0) + 1
        return False
    take_key(state, message_id)
    return True


def take_key(state: QueueState, message_id: str) -> None:
    """A keyed message that waits again becomes its key's message."""
    key = key_of(state, message_id)
    if key is not None:
        state.keys[key] = message_id


# unique_for holds


def live_holder(state: QueueState, key: str) -> str | None:
    """Who holds the key; call after ``reclaim_holds``, which forgets the holds that ended."""
    return state.holders.get(key)


def start_hold(state: QueueState, key: str, holder: str, end_ms: int) -> None:
    state.holders[key] = holder
    state.hold_ends.add(key, end_ms)


def reclaim_holds(state: QueueState, now: int) -> None:
    """Forget every hold that has ended (a hold lasts until its end time, exclusive), as
    Redis reclaims an expired key: nobody sweeps."""
    for key, _ in state.hold_ends.pop_upto(now, len(state.hold_ends)):
        state.holders.pop(key, None)


# Outbox rows: a relayed keyed row carries (database, row id), see NewMessage.outbox_row.

# key -> (message id, {database: row id}), as {tag}:key_rows holds them.
KeyRows = dict[str, tuple[str, dict[str, int]]]


def overtaken(
    state: QueueState, remembered: KeyRows, key: str, holder: str, row: tuple[str, int] | None
) -> bool:
    """Whether a row of ``row``'s database newer than it created or replaced ``holder``, the
    key's waiting message; ``remembered``: the rows a batch remembered so far, over the
    state's."""
    if row is None:
        return False
    message_id, rows = remembered.get(key) or state.key_rows.get(key) or ("", {})
    newest = rows.get(row[0]) if message_id == holder else None
    return newest is not None and row[1] < newest


def remember(
    state: QueueState, remembered: KeyRows, key: str, message_id: str, row: tuple[str, int]
) -> None:
    """``row``'s replace created or replaced ``message_id``, the key's message."""
    current = remembered.get(key) or state.key_rows.get(key)
    rows = dict(current[1]) if current is not None and current[0] == message_id else {}
    rows[row[0]] = row[1]
    remembered[key] = (message_id, rows)
