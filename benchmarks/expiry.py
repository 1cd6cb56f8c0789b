"""Expiry (issue #27): what an expiring message costs Redis beside a plain one, through its
whole life in this process (send_many, then fetches and acks), and what dead-lettering one
that expired before its fetch costs.

Measured as Redis's own time in the script calls (INFO commandstats, reset before each
mode), which a shared machine's load disturbs far less than the rates: the client's share
of the wall clock drops out."""

import time
from dataclasses import dataclass
from typing import Any

from benchmarks import probes
from benchmarks.report import Row
from delayqueue_django import get_queue

# Deliveries per fetch, as the worker's default FETCH_BATCH_SIZE.
FETCH = 100
# An expiry none of the "expiring" messages reaches: they are handled long before.
LONG_EXPIRY = 3600.0
# The "expired" ones expire this soon after their send, and are fetched after it passed.
SHORT_EXPIRY = 0.001
MODES = ("plain", "expiring", "expired")
LABELS = {
    "plain": "plain (no expiry)",
    "expiring": "with an expiry, handled before it",
    "expired": "expired before its fetch (dead-lettered by the fetch)",
}


@dataclass(frozen=True)
class Cycle:
    redis_us_per_message: float  # Redis time in script calls per message, send to the end
    commands_per_message: float  # every Redis command, those inside scripts included


def cycle(count: int, mode: str, probe_client: Any) -> Cycle:
    """Send ``count`` messages due now (``mode``: see MODES) in one send_many, then fetch
    them ``FETCH`` at a time and ack what is handed out, until the queue is empty. Redis is
    emptied first, its statistics reset."""
    queue = get_queue()
    probe_client.flushall()
    probe_client.config_resetstat()
    expires = {"plain": None, "expiring": LONG_EXPIRY, "expired": SHORT_EXPIRY}[mode]
    queue.send_many([{"n": n} for n in range(count)], expires=expires)
    if mode == "expired":
        time.sleep(SHORT_EXPIRY * 10)
    handled = 0
    while True:
        fetched = queue.fetch(FETCH)
        if fetched.messages:
            handled += len(queue.ack(fetched.messages))
        elif fetched.next_ms is None or fetched.next_ms > fetched.now_ms:
            break
    used = probes.server_usage(probe_client)  # before the check below: its stats call too
    dead = queue.stats()["garbage"]
    expected = (0, count) if mode == "expired" else (count, 0)
    if (handled, dead) != expected:
        raise RuntimeError(f"{mode}: {handled} handled and {dead} dead of {count}")
    counts = used.calls
    counts.pop("config|resetstat", None)
    return Cycle(
        redis_us_per_message=used.script_usec / count,
        commands_per_message=sum(counts.values()) / count,
    )


def rows(count: int, cycles: dict[str, list[Cycle]]) -> list[Row]:
    what = f"{count:,} messages sent, fetched and acked in this process"
    result = [
        Row(
            f"{what}: Redis time per message in script calls (INFO commandstats), {LABELS[mode]}",
            [c.redis_us_per_message for c in cycles[mode]],
            "µs",
            "",
            digits=1,
        )
        for mode in MODES
    ]
    result.append(
        Row(
            f"{what}: {LABELS['expiring']} ÷ plain, Redis time, run by run",
            [
                expiring.redis_us_per_message / plain.redis_us_per_message
                for expiring, plain in zip(cycles["expiring"], cycles["plain"], strict=True)
            ],
            "",
            "near 1",
            digits=2,
        )
    )
    return result
