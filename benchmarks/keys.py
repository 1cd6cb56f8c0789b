"""Keys (issue #26): a keyed send beside a plain one, what a key costs Redis's memory, and
Redis reclaiming a million ``unique_for`` holds by its own expiry.

The rates are measured the way benchmarks.send measures a plain send (one call per message,
and one ``send_many``), with the same payloads, so that their ratio is the key's cost."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import delayqueue_django
from benchmarks import probes
from benchmarks.report import Row
from benchmarks.send import DELAY
from delayqueue_django import Outgoing, get_queue

# One key sent over and over with if_exists="replace" (debounce): every send but the first
# rewrites the same waiting message.
REPLACED_KEY = "digest:user:7"
# send_many calls of this many messages while filling with held keys, as scale.fill does.
HOLD_CHUNK = 10_000
# How often the reclaim is polled (INFO keyspace: one cheap command).
RECLAIM_POLL_SECONDS = 0.05


def key_of(n: int) -> str:
    return f"order-{n}-expiry"


def single_rate(count: int, mode: str) -> float:
    """Messages per second, one ``delayqueue_django.send`` call each: "plain" (no key),
    "keep" (a new key each) or "replace" (the one key, replaced every time)."""
    send = delayqueue_django.send
    options = _single_options(mode)
    started = time.perf_counter()
    for n in range(count):
        send({"order": n}, delay=DELAY, **options(n))
    return count / (time.perf_counter() - started)


def _single_options(mode: str) -> Callable[[int], dict[str, Any]]:
    if mode == "plain":
        return lambda n: {}
    if mode == "keep":
        return lambda n: {"key": key_of(n)}
    if mode == "replace":
        return lambda n: {"key": REPLACED_KEY, "if_exists": "replace"}
    raise ValueError(f"mode must be plain, keep or replace, not {mode!r}")


def bulk_rate(count: int, mode: str) -> float:
    """Messages per second through one ``send_many`` call of ``count`` items, as
    single_rate's modes (for "replace", every item names the one key: each replaces the
    one before it in the same call)."""
    options = _single_options(mode)
    items = [Outgoing({"order": n}, delay=DELAY, **options(n)) for n in range(count)]
    queue = get_queue()
    started = time.perf_counter()
    queue.send_many(items)
    return count / (time.perf_counter() - started)


@dataclass(frozen=True)
class KeyMemory:
    index_per_key: float  # MEMORY USAGE of the keys hash, per key it holds
    payload_added: float  # a keyed message's payload entry less a plain one's, per message
    hold: float  # MEMORY USAGE of one unique_for hold string


def memory_per_key(count: int, probe_client: Any) -> KeyMemory:
    """What ``count`` keyed messages (one ``unique_for`` hold each) cost Redis beyond
    ``count`` plain ones with the same payloads. Redis is emptied first, and between."""
    queue = get_queue()
    names = queue.store.keys
    probe_client.flushall()
    queue.send_many([Outgoing({"order": n}, delay=DELAY) for n in range(count)])
    plain_payloads = _usage(probe_client, names.key("payload"))
    probe_client.flushall()
    queue.send_many(
        [Outgoing({"order": n}, delay=DELAY, key=key_of(n), unique_for=DELAY) for n in range(count)]
    )
    keyed_payloads = _usage(probe_client, names.key("payload"))
    index = _usage(probe_client, names.key("keys"))
    hold = _usage(probe_client, names.key(f"hold:{key_of(0)}"))
    probe_client.flushall()
    return KeyMemory(
        index_per_key=index / count,
        payload_added=(keyed_payloads - plain_payloads) / count,
        hold=hold,
    )


def _usage(probe_client: Any, name: str) -> int:
    # SAMPLES 0: every field of a hash, not an estimate from five of them.
    used = probe_client.memory_usage(name, samples=0)
    if used is None:
        raise RuntimeError(f"{name} is not in Redis: the keyed send did not write it")
    return int(used)


@dataclass(frozen=True)
class Reclaim:
    send_rate: float  # messages per second, in send_many calls of HOLD_CHUNK
    holds: int  # hold strings Redis held once the sends were done
    seconds: float  # from the end of the last hold's window to the last hold gone
    memory_freed: int  # used_memory's drop over that time (bytes)

    def __str__(self) -> str:
        return (
            f"{self.holds:,} holds sent at {self.send_rate:,.0f} msg/s, gone "
            f"{self.seconds:.2f} s after the last one's window, {self.memory_freed:,} bytes freed"
        )


def reclaim(count: int, window: float, probe_client: Any, timeout: float = 600) -> Reclaim:
    """Send ``count`` keyed messages with ``unique_for=window`` through send_many, then time
    Redis's own expiry: until every hold string is gone. Redis is emptied first. The
    messages stay pending (their key pointers with them): only the holds expire.

    A hold is the only key of the queue's with a time to live, so INFO keyspace's "expires"
    counts them without a scan of a million keys."""
    queue = get_queue()
    probe_client.flushall()
    started = time.perf_counter()
    for first in range(0, count, HOLD_CHUNK):
        queue.send_many(
            [
                Outgoing({"order": n}, delay=DELAY, key=key_of(n), unique_for=window)
                for n in range(first, min(first + HOLD_CHUNK, count))
            ]
        )
    sent = time.perf_counter()
    holds = expiring_keys(probe_client)
    before = probes.used_memory(probe_client)
    while expiring_keys(probe_client):
        if time.perf_counter() - sent > timeout:
            raise TimeoutError(f"holds still in Redis {timeout} s after the sends")
        time.sleep(RECLAIM_POLL_SECONDS)
    gone = time.perf_counter()
    freed = before - probes.used_memory(probe_client)
    probe_client.flushall()
    return Reclaim(
        send_rate=count / (sent - started),
        holds=holds,
        # The last hold was set just before the sends returned: its window ends after this.
        seconds=max(gone - (sent + window), 0.0),
        memory_freed=freed,
    )


def expiring_keys(probe_client: Any) -> int:
    """Keys with a time to live in database 0 (INFO keyspace)."""
    keyspace = probe_client.info("keyspace").get("db0", {})
    return int(keyspace.get("expires", 0))


MODES = ("plain", "keep", "replace")
LABELS = {
    "plain": "plain (no key)",
    "keep": "a new key each (if_exists keep)",
    "replace": "one key, replaced each time (if_exists replace)",
}


def rate_rows(what: str, count: int, rates: dict[str, list[float]], target: str) -> list[Row]:
    """A row per mode, then each keyed mode's ratio to plain, run by run (the runs
    interleave the modes, so a change in the machine's load falls on all of them)."""
    rows = [
        Row(f"{what}, {count:,} messages: {LABELS[mode]}", rates[mode], "msg/s", target)
        for mode in MODES
    ]
    rows += [
        Row(
            f"{what}: {LABELS[mode]} ÷ plain, run by run",
            [keyed / plain for keyed, plain in zip(rates[mode], rates["plain"], strict=True)],
            "",
            "near 1",
            digits=2,
        )
        for mode in MODES[1:]
    ]
    return rows


def redis_time_rows(what: str, redis_us: dict[str, list[float]]) -> list[Row]:
    """Redis's own time per message in the script calls (INFO commandstats): steadier than
    the rates on a shared machine, as the client's share of the wall clock drops out."""
    return [
        Row(
            f"{what}: Redis time per message in its script calls (INFO commandstats), "
            f"{LABELS[mode]}",
            redis_us[mode],
            "µs",
            "",
            digits=1,
        )
        for mode in MODES
    ]


def memory_rows(count: int, memory: KeyMemory) -> list[Row]:
    return [
        Row(
            f"Redis bytes per key held: the keys hash (MEMORY USAGE ÷ {count:,} keys)",
            [memory.index_per_key],
            "bytes",
            "",
        ),
        Row(
            "Redis bytes per key held: a keyed message's payload entry beyond a plain one's "
            "(the key and generation stored with it)",
            [memory.payload_added],
            "bytes",
            "",
        ),
        Row("Redis bytes per unique_for hold string (MEMORY USAGE)", [memory.hold], "bytes", ""),
    ]


def reclaim_rows(count: int, window: float, runs: list[Reclaim]) -> list[Row]:
    what = f"{count:,} keys with unique_for={window:g} s (send_many)"
    return [
        Row(f"{what}: sent", [r.send_rate for r in runs], "msg/s", ""),
        Row(
            f"{what}: holds still in Redis when the sends returned (the earlier ones expired "
            "meanwhile)",
            [r.holds for r in runs],
            "",
            "",
        ),
        Row(
            f"{what}: every hold gone (Redis's own expiry, INFO keyspace), after the last "
            "hold's window ended",
            [r.seconds for r in runs],
            "s",
            "reclaimed without a sweep",
            digits=2,
        ),
        Row(
            f"{what}: Redis memory freed by the expiry, per hold",
            [r.memory_freed / max(r.holds, 1) for r in runs],
            "bytes",
            "",
        ),
    ]
