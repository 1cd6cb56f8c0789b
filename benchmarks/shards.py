"""Sharding: one queue spread over the masters of a private Redis Cluster (``SHARDS``).

Send and drain throughput as the unsharded benchmarks measure them, and what each master
spent: its CPU time (``INFO cpu`` of each master, before and after) per message, and its
share of all the masters' CPU. On a machine with few cores the throughput is bounded by
the cores, which the masters, the workers and this process share; the CPU per master
shows how the load splits.
"""

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import delayqueue_django
from benchmarks import probes
from benchmarks.report import Row
from benchmarks.send import DELAY
from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.placement import shard_keys, shard_name, slot_of
from tests.redis_servers import RedisClusterServers


@dataclass(frozen=True)
class Master:
    """One master of the cluster and the shards of the queue it holds."""

    client: Any  # a plain client of this master alone, for INFO and TIME
    slots: str  # its slot ranges, "0-5460"
    shards: list[str]  # the names of the queue's shards in its slots


def masters(cluster: RedisClusterServers, layout: int) -> list[Master]:
    """The cluster's masters in slot order, each with the shards of the benchmark's queue
    (of ``layout`` shards) that fall in its slots."""
    probe = cluster.nodes[0].client()
    try:
        ranges = probe.cluster("slots")
    finally:
        probe.close()
    owned: dict[int, list[tuple[int, int]]] = {}
    for start, end, (_, port, *_) in (entry[:3] for entry in ranges):
        owned.setdefault(int(port), []).append((int(start), int(end)))
    keys = get_queue().store.keys
    slots = {
        shard_name(layout, index): slot_of(shard_keys(keys, layout, index))
        for index in range(layout)
    }
    found = []
    for port, spans in sorted(owned.items(), key=lambda item: min(item[1])):
        node = next(node for node in cluster.nodes if node.port == port)
        found.append(
            Master(
                client=node.client(),
                slots=", ".join(f"{start}-{end}" for start, end in sorted(spans)),
                shards=[
                    name
                    for name, slot in slots.items()
                    if any(start <= slot <= end for start, end in spans)
                ],
            )
        )
    return found


def cpu_seconds(found: Sequence[Master]) -> list[float]:
    """Each master's CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user)."""
    readings = [master.client.info("cpu") for master in found]
    return [float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]) for cpu in readings]


@dataclass(frozen=True)
class Split:
    """A measure's rate and what it cost each master."""

    rate: float  # messages per second
    cpu_us: list[float]  # per master, in slot order: its CPU time per message (µs)

    @property
    def total_us(self) -> float:
        return sum(self.cpu_us)

    @property
    def shares(self) -> list[float]:
        """Each master's part of the masters' CPU time, in %."""
        total = self.total_us
        return [100 * used / total if total else 0.0 for used in self.cpu_us]

    def __str__(self) -> str:
        split = " / ".join(f"{used:.1f}" for used in self.cpu_us)
        return f"{self.rate:,.0f} msg/s; Redis CPU per message by master {split} µs"


def _split(count: int, seconds: float, before: list[float], after: list[float]) -> Split:
    return Split(
        rate=count / seconds,
        cpu_us=[(end - start) * 1e6 / count for start, end in zip(before, after, strict=True)],
    )


def single_sends(count: int, found: Sequence[Master]) -> Split:
    """``count`` calls of ``delayqueue_django.send``, one message each."""
    send = delayqueue_django.send
    before = cpu_seconds(found)
    started = time.perf_counter()
    for n in range(count):
        send({"order": n}, delay=DELAY)
    seconds = time.perf_counter() - started
    return _split(count, seconds, before, cpu_seconds(found))


def bulk_send(count: int, found: Sequence[Master]) -> Split:
    """One ``send_many`` of ``count`` messages (one script call per shard and chunk)."""
    payloads = [{"order": n} for n in range(count)]
    queue = get_queue()
    before = cpu_seconds(found)
    started = time.perf_counter()
    queue.send_many(payloads, delay=DELAY)
    seconds = time.perf_counter() - started
    return _split(count, seconds, before, cpu_seconds(found))


@dataclass(frozen=True)
class Drain:
    split: Split  # rate from the due time to the last ack; CPU from the send to the last ack
    workers_cpu_us: float  # the worker processes' CPU time per message (user + system)

    def __str__(self) -> str:
        return f"{self.split}; workers {self.workers_cpu_us:.1f} µs CPU per message"


def in_queue(queue: Queue) -> int:
    """Messages not yet acked on every shard the queue reads: one pipelined round trip per
    master (ZCARD, LLEN, LLEN, ZCARD per shard)."""
    store: Any = queue.store
    pipe: Any = store.client.pipeline(transaction=False)
    for shard in store.shards.values():
        keys = shard.keys
        pipe.zcard(keys.key("pending"))
        pipe.llen(keys.key("ready"))
        pipe.llen(keys.key("retry"))
        pipe.zcard(keys.key("unack"))
    return sum(int(n) for n in pipe.execute())


def drain(
    count: int,
    cluster: RedisClusterServers,
    found: Sequence[Master],
    worker_cpu: Callable[[], float],
    *,
    poll: float = 0.005,
    lead: float = 1.0,
) -> Drain:
    """As ``benchmarks.drain.drain``, on every shard: ``count`` messages due together
    ``lead`` s from now while idle workers run (the caller's), timed from the due time to
    the last ack. Each master's CPU time counts from the ``send_many`` to the last ack, the
    polling for the end included (one pipelined read per master every ``poll`` s)."""
    queue = get_queue()
    clock = found[0].client  # the masters run on one machine, with one clock
    while True:
        cluster.flush()
        before = cpu_seconds(found)
        workers_before = worker_cpu()
        due_ms = round((probes.server_time(clock) + lead) * 1000)
        at = datetime.fromtimestamp(due_ms / 1000, UTC)
        queue.send_many([{"n": n} for n in range(count)], at=at)
        if probes.server_time(clock) * 1000 < due_ms - 50:
            break
        lead *= 2
    deadline = time.monotonic() + 120 + count / 100
    while (left := in_queue(queue)) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{left} messages still not acked after the drain's timeout")
        time.sleep(poll)
    finished = time.time()
    after = cpu_seconds(found)
    workers_used = worker_cpu() - workers_before
    acked, failed = probes.acked_and_failed(queue)
    if acked != count or failed:
        raise RuntimeError(f"drain acked {acked} of {count} messages, {failed} failed")
    return Drain(
        split=_split(count, finished - due_ms / 1000, before, after),
        workers_cpu_us=workers_used * 1e6 / count,
    )


@dataclass(frozen=True)
class MasterRow(Row):
    """A master's CPU time per message over the runs, then the median of its shares of all
    the masters' CPU time."""

    shares: Sequence[float] = ()

    def result(self) -> str:
        return f"{super().result()}; {statistics.median(self.shares):.0f}% of all masters'"


def rows(
    layout: int,
    found: Sequence[Master],
    *,
    workers: int,
    bulk_messages: int,
    drain_messages: int,
    singles: Sequence[Split],
    bulks: Sequence[Split],
    drains: Sequence[Drain],
) -> list[Row]:
    """The table's rows for one layout: throughput, then the masters' CPU time."""
    count = len(found)
    what = f"SHARDS {layout} on {count} masters"
    plural = "process" if workers == 1 else "processes"
    even = f"{100 / count:.0f}% each" if layout % count == 0 else ""
    split = [d.split for d in drains]
    per_master: list[Row] = [
        MasterRow(
            f"{what}: Redis CPU per message on master {index + 1} (slots {master.slots}; "
            f"shards {', '.join(master.shards) or 'none'}), in the drain",
            [s.cpu_us[index] for s in split],
            "µs",
            even,
            digits=1,
            shares=[s.shares[index] for s in split],
        )
        for index, master in enumerate(found)
    ]
    return [
        Row(
            f"{what}: send(), one call per message, one process", [s.rate for s in singles], "msg/s"
        ),
        Row(
            f"{what}: Redis CPU per send(), all masters (INFO cpu)",
            [s.total_us for s in singles],
            "µs",
            digits=1,
        ),
        Row(f"{what}: send_many, {bulk_messages:,} messages", [s.rate for s in bulks], "msg/s"),
        Row(
            f"{what}: drain {drain_messages:,} due together, {workers} worker {plural}",
            [s.rate for s in split],
            "msg/s",
            "bounded by the cores",
        ),
        Row(
            f"{what}: Redis CPU per message in the drain, all masters (send_many + fetch + "
            "ack; INFO cpu)",
            [s.total_us for s in split],
            "µs",
            digits=1,
        ),
        *per_master,
        Row(
            f"{what}: the worker processes' CPU per message in the drain",
            [d.workers_cpu_us for d in drains],
            "µs",
            digits=1,
        ),
    ]
