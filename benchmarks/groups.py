"""Ordered groups (issue #27): what a grouped message costs beside a plain one, sent with
``send_many`` and drained in this process (fetches of 100, each acked), in Redis's own time
per message (INFO commandstats: steadier than rates on a shared machine) and in messages per
second. Modes: plain; spread over 100 groups (each fetch still finds up to 100 groups free);
and one group (one message per fetch: the order's price, by design)."""

import time
from typing import Any

from benchmarks import probes
from benchmarks.report import Row
from delayqueue_django import Outgoing, get_queue

MODES = ("plain", "groups", "one group")
LABELS = {
    "plain": "plain (no group)",
    "groups": "grouped, spread over 100 groups",
    "one group": "grouped, all in one group",
}
FETCH = 100


def _group(mode: str, n: int) -> str | None:
    if mode == "plain":
        return None
    return "customer:0" if mode == "one group" else f"customer:{n % 100}"


def send_and_drain(count: int, mode: str, probe_client: Any) -> tuple[float, float]:
    """``(Redis µs per message, messages per second)`` of sending ``count`` messages in one
    ``send_many`` and draining them (fetch, ack) until none is left. Redis is emptied first."""
    queue = get_queue()
    probe_client.flushall()
    probe_client.config_resetstat()
    started = time.perf_counter()
    queue.send_many([Outgoing({"order": n}, group=_group(mode, n)) for n in range(count)])
    handled = 0
    while handled < count:
        deliveries = queue.store.fetch(FETCH).deliveries
        queue.store.ack([(delivery.id, delivery.lease) for delivery in deliveries])
        handled += len(deliveries)
    elapsed = time.perf_counter() - started
    return probes.server_usage(probe_client).script_usec / count, count / elapsed


def rows(count: int, redis_us: dict[str, list[float]], rates: dict[str, list[float]]) -> list[Row]:
    return [
        *(
            Row(
                f"send_many + drain of {count:,}: Redis time per message in its script calls "
                f"(INFO commandstats), {LABELS[mode]}",
                redis_us[mode],
                "µs",
                digits=1,
            )
            for mode in MODES
        ),
        *(
            Row(f"send_many + drain of {count:,} in one process, {LABELS[mode]}", rates[mode], "/s")
            for mode in MODES
        ),
    ]
