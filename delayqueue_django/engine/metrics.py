"""The metrics history as the stores keep it (see "Metrics history" in _prelude.lua): per
minute for the last day, per hour for 14 days, each record the counts of one minute or hour.

A Redis store returns its records packed (36 bytes each: seven big-endian u32, then an
i64, as BITFIELD writes them), the memory store as ``Counts``; both become a
``MetricsRead``, which a sharded queue adds up over its shards."""

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

RECORD = struct.Struct(">7Iq")
U32_MAX = 2**32 - 1
MINUTE_MS = 60_000
# Minute records are kept for the last day (the current minute and 1439 before), hour
# records for 14 days; a read reaches back 15 days at most.
MINUTES_KEPT = 1440
HOURS_KEPT_DAYS = 14
READ_BACK_MINUTES = 15 * 1440
# The fields of a record, in the order stored.
FIELDS = ("sent", "acked", "nacked", "dead", "expired", "handed", "lag_max", "lag_sum")


class Counts(NamedTuple):
    """One minute's or hour's counts: messages sent, deliveries acked, refused (nacked:
    to be retried or postponed, or superseded), dead (buried), expired, and handed out,
    with the largest and the summed lag (ms) of those handed out."""

    sent: int = 0
    acked: int = 0
    nacked: int = 0
    dead: int = 0
    expired: int = 0
    handed: int = 0
    lag_max: int = 0
    lag_sum: int = 0

    def plus(self, other: "Counts") -> "Counts":
        """Both added up: the counts summed (saturating as the stores do), the largest lag
        kept."""

        def added(a: int, b: int) -> int:
            return min(a + b, U32_MAX)

        return Counts(
            sent=added(self.sent, other.sent),
            acked=added(self.acked, other.acked),
            nacked=added(self.nacked, other.nacked),
            dead=added(self.dead, other.dead),
            expired=added(self.expired, other.expired),
            handed=added(self.handed, other.handed),
            lag_max=max(self.lag_max, other.lag_max),
            lag_sum=self.lag_sum + other.lag_sum,
        )


EMPTY = Counts()


class Entry(NamedTuple):
    """The counts of ``minutes`` minutes (1, or 60 for an hour record) from ``minute``
    (ms // 60000 on the store's clock)."""

    minute: int
    minutes: int
    counts: Counts


@dataclass(frozen=True)
class MetricsRead:
    """What one read of the history found: the store's clock, and its entries (not in any
    order; several may cover the same minute, to be added up)."""

    now_ms: int
    entries: list[Entry]

    @property
    def current_minute(self) -> int:
        return self.now_ms // MINUTE_MS


def unpacked(raw: bytes | None) -> list[Counts]:
    """The records of a string as stored, in order. BITFIELD grows a string only as far as
    the field it writes: the last record may end short, its missing bytes zeros."""
    if not raw:
        return []
    whole = -(-len(raw) // RECORD.size)
    padded = raw.ljust(whole * RECORD.size, b"\0")
    return [Counts(*RECORD.unpack_from(padded, i * RECORD.size)) for i in range(whole)]


def read_reply(reply: Sequence[Any]) -> MetricsRead:
    """metrics.lua's reply: {now_ms, first_hour, minutes, first_day, hours, old, ...}."""
    now_ms, first_hour, minutes, first_day, hours, old = reply[:6]
    entries: list[Entry] = []
    for offset, raw in enumerate(minutes):
        start = (int(first_hour) + offset) * 60
        entries += [
            Entry(start + i, 1, counts) for i, counts in enumerate(unpacked(raw)) if counts != EMPTY
        ]
    for offset, raw in enumerate(hours):
        start = (int(first_day) + offset) * 24 * 60
        entries += [
            Entry(start + i * 60, 60, counts)
            for i, counts in enumerate(unpacked(raw))
            if counts != EMPTY
        ]
    # A release before counted acked and failed alone, in throughput; failed read as nacked.
    for i in range(0, len(old), 3):
        entries.append(Entry(int(old[i]), 1, Counts(acked=int(old[i + 1]), nacked=int(old[i + 2]))))
    return MetricsRead(int(now_ms), entries)


def merged(reads: Iterable[MetricsRead]) -> MetricsRead:
    """Several stores' reads (a sharded queue's shards) as one: their entries, and the
    latest clock (on a cluster, masters' clocks may differ by a little)."""
    reads = list(reads)
    return MetricsRead(
        max(read.now_ms for read in reads), [entry for read in reads for entry in read.entries]
    )


def throughput_rows(read: MetricsRead, minutes: int) -> list[tuple[int, int, int]]:
    """``(minute_start_ms, acked, failed)`` for the last ``minutes`` minutes, oldest first,
    failed being the nacked, dead and expired of the history."""
    current = read.current_minute
    rows = {minute: [0, 0] for minute in range(current - minutes + 1, current + 1)}
    for entry in read.entries:
        row = rows.get(entry.minute)
        if row is not None and entry.minutes == 1:
            counts = entry.counts
            row[0] += counts.acked
            row[1] += counts.nacked + counts.dead + counts.expired
    return [(minute * MINUTE_MS, acked, failed) for minute, (acked, failed) in rows.items()]
