"""Draining: many messages falling due at the same moment, handled by worker processes with
a no-op handler, timed from the due time to the last ack."""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks import probes
from delayqueue_django import get_queue


@dataclass(frozen=True)
class Drain:
    rate: float  # messages per second, from the due time to the last ack
    seconds: float
    commands_per_message: float  # every Redis command, those inside scripts included
    scripts_per_message: float  # script calls (round trips) per message
    redis_us_per_message: float  # Redis's time in those scripts (INFO commandstats)


def drain(count: int, probe_client: Any, *, poll: float = 0.002, lead: float = 1.0) -> Drain:
    """Send ``count`` messages due together ``lead`` s from now, while idle workers run
    (started by the caller); wait until all are acked.

    The send must finish before the due time, or the workers would start early: the lead
    doubles until it does.
    """
    queue = get_queue()
    while True:
        probe_client.flushall()
        due_ms = round((probes.server_time(probe_client) + lead) * 1000)
        at = datetime.fromtimestamp(due_ms / 1000, UTC)
        queue.send_many([{"n": n} for n in range(count)], at=at)
        if probes.server_time(probe_client) * 1000 < due_ms - 50:
            break
        lead *= 2
    probe_client.config_resetstat()
    finished, polls = probes.wait_drained(queue, poll, timeout=120 + count / 100)
    counts = probes.command_counts(probe_client)
    script_us = float(probe_client.info("commandstats")["cmdstat_evalsha"]["usec"])
    acked, failed = probes.acked_and_failed(queue)
    if acked != count or failed:
        raise RuntimeError(f"drain acked {acked} of {count} messages, {failed} failed")
    for name, per_poll in probes.POLL_COMMANDS.items():
        counts[name] -= per_poll * polls
    del counts["config|resetstat"]
    seconds = finished - due_ms / 1000
    return Drain(
        rate=count / seconds,
        seconds=seconds,
        commands_per_message=sum(counts.values()) / count,
        scripts_per_message=counts["evalsha"] / count,
        redis_us_per_message=script_us / count,
    )
