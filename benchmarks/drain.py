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
    redis_cpu_us_per_message: float  # the server's CPU time, the send included (INFO cpu)


def drain(count: int, probe_client: Any, *, poll: float = 0.002, lead: float = 1.0) -> Drain:
    """Send ``count`` messages due together ``lead`` s from now, while idle workers run
    (started by the caller); wait until all are acked.

    The send must finish before the due time, or the workers would start early: the lead
    doubles until it does. The server's CPU time counts from the send to the last ack.
    """
    queue = get_queue()
    while True:
        probe_client.flushall()
        before = probes.server_usage(probe_client)
        due_ms = round((probes.server_time(probe_client) + lead) * 1000)
        at = datetime.fromtimestamp(due_ms / 1000, UTC)
        queue.send_many([{"n": n} for n in range(count)], at=at)
        if probes.server_time(probe_client) * 1000 < due_ms - 50:
            break
        lead *= 2
    probe_client.config_resetstat()
    finished, polls = probes.wait_drained(queue, poll, timeout=120 + count / 100)
    used = probes.server_usage(probe_client)  # its commands since the reset
    counts = used.calls
    acked, failed = probes.acked_and_failed(queue)
    if acked != count or failed:
        raise RuntimeError(f"drain acked {acked} of {count} messages, {failed} failed")
    for name, per_poll in probes.POLL_COMMANDS.items():
        counts[name] -= per_poll * polls * probes.polled_shards(queue)
    del counts["config|resetstat"]
    seconds = finished - due_ms / 1000
    return Drain(
        rate=count / seconds,
        seconds=seconds,
        commands_per_message=sum(counts.values()) / count,
        scripts_per_message=probes.script_calls(counts) / count,
        redis_us_per_message=used.script_usec / count,
        redis_cpu_us_per_message=(used.cpu_seconds - before.cpu_seconds) * 1e6 / count,
    )
