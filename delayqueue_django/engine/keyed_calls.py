"""The keyed calls of the Redis stores (send_keyed.lua, reschedule.lua, and remove.lua and
lookup.lua by key): their script arguments and what their replies mean. Shared by RedisStore
and AsyncRedisStore, which make the calls."""

from collections.abc import Iterator, Sequence
from typing import Any

from redis.exceptions import ResponseError

from delayqueue_django.engine.errors import DuplicateKey
from delayqueue_django.engine.expiry_calls import expiry_args
from delayqueue_django.engine.records import KeyedSent, NewMessage

# send_keyed.lua's outcome codes.
OUTCOMES = {1: "created", 2: "kept", 3: "replaced", 4: "held"}


def wire(text: str) -> bytes:
    """An id or key as Redis stores it (ids read back with surrogate escapes go back as the
    very same bytes)."""
    return text.encode("utf-8", "surrogateescape")


def send_keyed_calls(
    channel: str, messages: Sequence[NewMessage], batch_size: int
) -> Iterator[tuple[Sequence[NewMessage], list[Any]]]:
    """Each chunk of ``batch_size`` messages with its send_keyed script's ARGV."""
    for start in range(0, len(messages), batch_size):
        chunk = messages[start : start + batch_size]
        args: list[Any] = [channel, len(chunk)]
        grouped: list[Any] = []
        for index, message in enumerate(chunk, start=1):
            if message.key is None:
                raise ValueError(f"send_keyed was given message {message.id!r} without a key")
            at = "" if message.at_ms is None else message.at_ms
            args += [wire(message.id), at, message.delay_us, message.budget, message.payload]
            args += [wire(message.key), message.if_exists, message.unique_ms]
            if message.group is not None:
                grouped += [index, wire(message.group)]
        # The groups' count and pairs, then the expiries (see send_keyed.lua).
        yield chunk, [*args, len(grouped) // 2, *grouped, *expiry_args(chunk)]


def keyed_sent(flat: Sequence[Any]) -> list[KeyedSent]:
    """send_keyed.lua's reply (without its warnings) as one KeyedSent per message."""
    return [
        KeyedSent(
            id=_id(flat[i]),
            outcome=OUTCOMES[int(flat[i + 1])],
            due_ms=None if int(flat[i + 2]) < 0 else int(flat[i + 2]),
        )
        for i in range(0, len(flat), 3)
    ]


def duplicate_key(error: ResponseError, chunk: Sequence[NewMessage]) -> DuplicateKey | None:
    """send_keyed.lua's refusal "DUPLICATE_KEY <n> <held> <id>" as DuplicateKey, naming the
    key of message n of the call (the key is not in the reply: an error reply cannot carry
    every character a key may hold); None for any other error."""
    text = str(error)
    if not text.startswith("DUPLICATE_KEY "):
        return None
    _, position, held, message_id = text.split(" ", 3)
    key = chunk[int(position) - 1].key
    assert key is not None  # send_keyed_calls sends keyed messages only
    return DuplicateKey(key, message_id, held=held == "1")


def cancel_key_args(key: str) -> list[Any]:
    """remove.lua's ARGV to cancel the key's message if it waits."""
    return [wire(key), "cancel", "", "key"]


def cancelled_id(reply: Sequence[Any]) -> str | None:
    """The id remove.lua's reply says it removed, or None."""
    state, message_id = reply[0], reply[1]
    return _id(message_id) if state else None


def reschedule_args(
    channel: str, message_id: str | None, key: str | None, at_ms: int | None, delay_us: int
) -> list[Any]:
    """reschedule.lua's ARGV: exactly one of ``message_id`` and ``key`` names the message."""
    if (message_id is None) == (key is None):
        raise ValueError("reschedule needs exactly one of message_id and key")
    by, name = ("id", message_id) if key is None else ("key", key)
    assert name is not None
    return [channel, by, wire(name), "" if at_ms is None else at_ms, delay_us]


def rescheduled_due(reply: Sequence[Any]) -> int | None:
    """The new due time in reschedule.lua's reply, or None when nothing waited."""
    due = int(reply[1])
    return None if due < 0 else due


def _id(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
