"""Attempt records (issue #35): what an ack and a nack cost Redis in commands per message
(an ack of a message that never failed must cost what it did before the records; a nack
pays for its record), and the bytes an attempt record takes in Redis.

Commands are counted with INFO commandstats (those run inside the scripts included, the
statistics' own calls left out), reset before each step: exact, whatever the machine."""

from dataclasses import dataclass
from typing import Any

from benchmarks import probes
from benchmarks.report import Row
from delayqueue_django import get_queue
from delayqueue_django.core.message import Message

# Deliveries per fetch, ack and nack, as the worker's default FETCH_BATCH_SIZE.
BATCH = 100
# An error whose text (2 KiB kept, of 2-byte characters) and traceback (its 8 KiB tail) are
# cut at their bounds: lines of 80 characters, as a traceback's are. (A traceback of empty
# lines would take twice its bytes, each line break escaped in JSON as two.)
LONG = "é" * 2048 + "\n".join("x" * 79 for _ in range(200))


@dataclass(frozen=True)
class Costs:
    ack_commands: float  # per message acked that never failed
    nack_commands: float  # per message nacked (its record written)
    retried_ack_commands: float  # per message acked after a failed attempt (records dropped)


def _counted(probe_client: Any, step: Any) -> int:
    """The Redis commands ``step()`` ran (inside scripts too)."""
    before = probes.server_usage(probe_client)
    step()
    used = probes.server_usage(probe_client).since(before)
    # (A reading is an INFO of its own, counted in the second one.)
    used.calls.subtract({"info": 1})
    return sum(count for count in used.calls.values() if count > 0)


def _failure(message: Message) -> BaseException:
    """A handler's usual failure: an exception raised a few frames down."""

    def charge(order: int) -> None:
        raise ValueError(f"the payment provider declined order {order}: card expired")

    try:
        charge(message.payload["n"])
    except ValueError as error:
        return error
    raise AssertionError("unreachable")


def costs(count: int, probe_client: Any) -> Costs:
    """``count`` messages sent, fetched and acked; as many fetched, nacked once (each with
    its error's note) and then acked. Commands per message of each step."""
    queue = get_queue()
    probe_client.flushall()
    acks = nacks = retried = 0
    queue.send_many([{"n": n} for n in range(count)])
    while messages := queue.fetch(BATCH).messages:
        acks += _counted(probe_client, lambda: queue.ack(messages))
    queue.send_many([{"n": n} for n in range(count)])
    while messages := queue.fetch(BATCH).messages:
        first = [m for m in messages if m.attempt == 1]
        again = [m for m in messages if m.attempt > 1]
        notes = {m.id: queue.attempt_note(m, _failure(m), ran_seconds=0.01) for m in first}
        if first:
            nacks += _counted(
                probe_client,
                lambda: queue.nack(first, delay=0, attempts=notes),  # noqa: B023
            )
        if again:
            retried += _counted(probe_client, lambda: queue.ack(again))  # noqa: B023
    return Costs(acks / count, nacks / count, retried / count)


def bytes_per_record(count: int, probe_client: Any, *, at_bounds: bool) -> float:
    """Redis memory of the records hash (MEMORY USAGE, every field sampled) per record:
    ``count`` messages refused until they are dead letters (RETRY_COUNT + 1 records each),
    each with a usual failure, or one whose text and traceback are at their bounds."""
    queue = get_queue()
    probe_client.flushall()
    ids = queue.send_many([{"n": n} for n in range(count)])
    while messages := queue.fetch(BATCH).messages:
        notes = {}
        for m in messages:
            error = ValueError(LONG) if at_bounds else _failure(m)
            notes[m.id] = queue.attempt_note(m, error)
        queue.nack(messages, delay=0, attempts=notes)
    key = queue.store.keys.key("history")
    records = sum(len(queue.history(i)) for i in ids)
    return int(probe_client.memory_usage(key, samples=0)) / records


def rows(count: int, runs: list[Costs], typical: list[float], bounded: list[float]) -> list[Row]:
    what = f"attempt records, {count:,} messages in batches of {BATCH}"
    return [
        Row(
            f"{what}: Redis commands per ack of a message that never failed",
            [c.ack_commands for c in runs],
            "",
            "unchanged by the records",
            digits=2,
        ),
        Row(
            f"{what}: Redis commands per nack, its attempt record written",
            [c.nack_commands for c in runs],
            "",
            "",
            digits=2,
        ),
        Row(
            f"{what}: Redis commands per ack of a message that failed once (its records dropped)",
            [c.retried_ack_commands for c in runs],
            "",
            "",
            digits=2,
        ),
        Row(
            "Redis bytes per attempt record, a usual failure (MEMORY USAGE)",
            typical,
            "bytes",
            "",
        ),
        Row(
            "Redis bytes per attempt record, text and traceback at their bounds (MEMORY USAGE)",
            bounded,
            "bytes",
            "at most 13 KiB (the bounds, and the allocator's rounding)",
        ),
    ]
