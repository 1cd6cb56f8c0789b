"""Outcome records (issue #35, HISTORY_RETENTION): what a record costs Redis in memory
(MEMORY USAGE of its keys, per message acked: the id's record, and a keyed message's key
index too), and what an ack costs in commands with the option off and on (INFO
commandstats, those inside the scripts included).

Every message is sent, fetched FETCH at a time and acked in this process, named by a worker
id as a worker names itself."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.test import override_settings

from benchmarks.report import Row
from delayqueue_django import Outgoing, get_queue

FETCH = 100
RETENTION = 24 * 3600  # seconds: no record expires while it is measured
WORKER = "bench-host-01:123456:a1b2c3"  # as long as a worker's id usually is
MODES = ("plain", "keyed")
LABELS = {"plain": "a plain message", "keyed": "a keyed message (key 'order:<n>')"}


@dataclass(frozen=True)
class Cycle:
    bytes_per_record: float  # MEMORY USAGE of the message's record keys, per message
    ack_commands_off: float  # Redis commands per acked message, HISTORY_RETENTION off
    ack_commands_on: float  # and on


def _ack_all(count: int, keyed: bool, probe: Any) -> float:
    """Send ``count`` messages due now, fetch and ack them all; returns the Redis commands
    per message of the acks alone."""
    queue = get_queue()
    probe.flushall()
    queue.send_many([Outgoing({"n": n}, key=f"order:{n}" if keyed else None) for n in range(count)])
    calls = 0
    while messages := queue.fetch(FETCH, fetcher=WORKER).messages:
        probe.config_resetstat()
        queue.ack(messages, fetcher=WORKER)
        stats = probe.info("commandstats")
        calls += sum(
            int(row["calls"]) for name, row in stats.items() if name != "cmdstat_config|resetstat"
        )
    return calls / count


def _record_bytes(probe: Any) -> int:
    names = [*probe.scan_iter(match="*:ended:*", count=1000)]
    names += [*probe.scan_iter(match="*:ended_key:*", count=1000)]
    return sum(int(probe.memory_usage(name, samples=0)) for name in names)


def cycle(count: int, mode: str, probe: Any) -> Cycle:
    keyed = mode == "keyed"
    off = _ack_all(count, keyed, probe)
    options = {**settings.DELAYQUEUES["default"], "HISTORY_RETENTION": RETENTION}
    with override_settings(DELAYQUEUES={"default": options}):
        on = _ack_all(count, keyed, probe)
        stored = _record_bytes(probe)
    if not stored:
        raise RuntimeError(f"{mode}: no outcome record was written")
    return Cycle(stored / count, off, on)


def rows(count: int, cycles: dict[str, list[Cycle]]) -> list[Row]:
    what = f"outcome records (HISTORY_RETENTION), {count:,} messages acked"
    result = []
    for mode in MODES:
        runs = cycles[mode]
        result += [
            Row(
                f"{what}: bytes per record of {LABELS[mode]} (MEMORY USAGE)",
                [c.bytes_per_record for c in runs],
                "B",
                "small: bounded by messages ended per retention",
            ),
            Row(
                f"{what}: Redis commands per ack of {LABELS[mode]}, option off",
                [c.ack_commands_off for c in runs],
                "",
                "as before #35",
                digits=2,
            ),
            Row(
                f"{what}: Redis commands per ack of {LABELS[mode]}, option on",
                [c.ack_commands_on for c in runs],
                "",
                "",
                digits=2,
            ),
        ]
    return result
