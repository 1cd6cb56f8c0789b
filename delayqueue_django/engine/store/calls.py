"""The scripts' arguments as the stores build them: a send's and a relay's chunks, rows of
ids, a shard's fetch within a reservation, and what a send's refusal means. Shared by
``RedisStore`` and ``AsyncRedisStore``."""

from collections.abc import Iterator, Sequence
from typing import Any

from redis.exceptions import OutOfMemoryError, ResponseError

from delayqueue_django.engine.errors import DuplicateMessageId, RedisOutOfMemory, expiry_refusal
from delayqueue_django.engine.expiry_calls import expiry_args
from delayqueue_django.engine.keyed import check_relayable
from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.records import NewMessage


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def send_calls(channel: str, messages: Sequence[NewMessage], batch_size: int) -> list[list[Any]]:
    """The send script's ARGV for each chunk of ``batch_size`` messages."""
    calls = []
    for chunk in _chunks(messages, batch_size):
        args: list[Any] = [channel, len(chunk)]
        grouped: list[Any] = []
        expiring = False
        for index, message in enumerate(chunk, start=1):
            at = "" if message.at_ms is None else message.at_ms
            args += [message.id, at, message.delay_us, message.budget, message.payload]
            if message.group is not None:
                grouped += [index, wire(message.group)]
            if message.expires_at_ms is not None or message.expires_in_us:
                expiring = True
        # The groups' count and pairs first, then (only when one expires) the expiries.
        args += [len(grouped) // 2, *grouped]
        calls.append(args + expiry_args(chunk) if expiring else args)
    return calls


def sent_alone(messages: Sequence[NewMessage]) -> NewMessage | None:
    """The message of a batch of one with no group or expiry, which one_send_call sends;
    else None."""
    if len(messages) != 1:
        return None
    message = messages[0]
    if message.group is None and message.expires_at_ms is None and not message.expires_in_us:
        return message
    return None


def one_send_call(channel: str, message: NewMessage) -> tuple[Any, ...]:
    """The send script's ARGV for one message with no group or expiry: send_calls's but
    for the groups' count, 0, which send.lua takes as said when it is left out (a send per
    message spends its time on the message: each argument costs redis-py some 0.15 µs to
    pack, redis.asyncio 0.5; see Lua.bound)."""
    at = "" if message.at_ms is None else message.at_ms
    return (channel, 1, message.id, at, message.delay_us, message.budget, message.payload)


def relay_calls(
    channel: str,
    messages: Sequence[NewMessage],
    forget: Sequence[str],
    keep_ms: int,
    batch_size: int,
) -> list[list[Any]]:
    """The relay script's ARGV for each chunk of ``batch_size`` messages; the first call
    carries the ids to forget (and is made for them alone when there is no message)."""
    chunks = list(_chunks(messages, batch_size)) or [[]]
    calls = []
    for number, chunk in enumerate(chunks):
        forgotten = forget if number == 0 else ()
        args: list[Any] = [channel, keep_ms, len(chunk), len(forgotten)]
        rows: list[Any] = []
        for place, message in enumerate(chunk, start=1):
            if message.at_ms is None:
                raise ValueError(f"a relayed message needs its due time (id {message.id!r})")
            check_relayable(message)
            args += [message.id, message.at_ms, message.budget, message.payload]
            if message.key is None:
                args += ["", "", 0]
            else:
                args += [wire(message.key), message.if_exists, message.unique_ms]
                if message.outbox_row is not None:
                    rows += [place, wire(message.outbox_row[0]), message.outbox_row[1]]
            args.append("" if message.group is None else wire(message.group))
        args += forgotten
        # The expiries, then (only when a keyed message carries its row) the rows.
        tail = expiry_args(chunk)
        if rows:
            tail = [*(tail or [0]), len(rows) // 3, *rows]
        calls.append(args + tail)
    return calls


def send_error(error: ResponseError, queue: str) -> Exception:
    """The send script's refusals as the package's exceptions; any other error as it is."""
    refused_expiry = expiry_refusal(str(error), queue)
    if refused_expiry is not None:
        return refused_expiry
    if str(error).startswith("DUPLICATE "):
        return DuplicateMessageId(
            f"message id {str(error).split(' ', 1)[1]!r} already exists in queue {queue!r}; "
            "nothing in its batch was written"
        )
    if isinstance(error, OutOfMemoryError):
        # Redis refuses a script's first write when over maxmemory; a send's first write
        # is its first message, so nothing of the batch was written.
        return RedisOutOfMemory(
            f"Redis is out of memory and refused messages for queue {queue!r}; nothing in "
            "their batch was written. It is over its maxmemory with the noeviction policy: "
            "let workers drain queues, or give Redis more memory. "
            f"({error})"
        )
    return error


def _id_rows(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``(id, ...)`` rows as one flat list of script arguments, ids as wire sends them.
    Checked first, as these are the verdicts' hot path: an ASCII id (str.isascii() reads
    a flag) goes as it is, and only a batch with another id pays for the encoding."""
    if all(row[0].isascii() for row in rows):
        return [value for row in rows for value in row]
    return [value for row in rows for value in (wire(row[0]), *row[1:])]


def _fetch_tail(
    leased_from: int | None, gated: bool, history_attempts: int
) -> tuple[int | str, ...]:
    """fetch.lua's ARGV[9] and ARGV[10], for a shard's fetch within a reservation, and
    ARGV[11], the bound on attempt records: none of them for a fetch without a reservation
    on a queue that keeps no records."""
    if history_attempts > 0:
        return ("" if leased_from is None else leased_from, 1 if gated else "", history_attempts)
    if leased_from is None and not gated:
        return ()
    return ("" if leased_from is None else leased_from, *((1,) if gated else ()))
