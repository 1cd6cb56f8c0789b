"""Outcome records (the queue option HISTORY_RETENTION): what is left of a message that
ended, and for how long. The scripts write them in the call that ends the message (see
"Outcome records" in _prelude.lua); this module holds their states, the argument that turns
them on, and how a stored record reads as a ``StoredMessage``.

A record is the string ``"<state>:<ended ms>:<attempts>:<worker bytes>:<worker><key>"`` under
``<tag>:ended:<id>``, and a keyed message's end also ``<tag>:ended_key:<key>`` -> its id,
both set with the retention as their TTL, so that Redis reclaims them itself.
"""

from delayqueue_django.engine.records import (
    StoredMessage,
    StoreLimits,
    meta_numbers,
    moment_of_ms,
)

ACKED, CANCELLED, REPLACED, EXPIRED_END, PURGED = (
    "acked",
    "cancelled",
    "replaced",
    "expired",
    "purged",
)
ENDED_STATES = (ACKED, CANCELLED, REPLACED, EXPIRED_END, PURGED)
# The state of a record that cannot be read (a foreign write, or a damaged one): shown as
# such, never raised.
DAMAGED_OUTCOME = "damaged"


def outcome_arg(limits: StoreLimits, worker: str = "") -> list[str]:
    """The scripts' argument that keeps outcome records ("ended:<ms>:<worker>"), as a list
    to append: empty when the queue keeps none, so that its calls are what they were."""
    if not limits.outcome_ms:
        return []
    return [f"ended:{limits.outcome_ms}:{worker}"]


def ended_message(message_id: str, raw: bytes | str) -> StoredMessage:
    """A stored record as the message it tells of; one that does not read as the scripts
    write it is DAMAGED_OUTCOME, with nothing else known."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
    parts = data.split(b":", 4)
    if len(parts) == 5:
        state = parts[0].decode("ascii", "replace")
        numbers = meta_numbers([part.decode("ascii", "replace") for part in parts[1:4]])
        ended_at = None if numbers is None else moment_of_ms(numbers[0])
        if state in ENDED_STATES and ended_at and numbers and numbers[2] <= len(parts[4]):
            _, attempts, worker_size = numbers
            rest = parts[4]
            worker = rest[:worker_size].decode("utf-8", "backslashreplace")
            key = rest[worker_size:].decode("utf-8", "surrogateescape")
            return StoredMessage(
                id=message_id,
                state=state,
                score_ms=None,
                payload=None,
                payload_size=0,
                lease=None,
                attempt=attempts,
                budget=None,
                key=key or None,
                ended_at=ended_at,
                worker=worker or None,
            )
    return StoredMessage(
        id=message_id,
        state=DAMAGED_OUTCOME,
        score_ms=None,
        payload=None,
        payload_size=0,
        lease=None,
        attempt=None,
        budget=None,
    )
