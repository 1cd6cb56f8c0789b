"""Draining: many messages falling due at the same moment, handled by worker processes with
a no-op handler, timed from the due time to the last ack."""

import time
from collections.abc import Callable
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
    # From the due time to the last ack, each process's CPU time (user + system) per
    # message: the server's (INFO cpu), the workers' (when the caller can read it: see
    # ``cpu``) and this process's, which polls for the end; and all of them together per
    # second of the drain, in cores.
    drain_redis_cpu_us_per_message: float = 0.0
    workers_cpu_us_per_message: float | None = None
    probe_cpu_us_per_message: float = 0.0
    cores_busy: float | None = None


def drain(
    count: int,
    probe_client: Any,
    *,
    poll: float = 0.002,
    lead: float = 1.0,
    cpu: Callable[[], float] | None = None,
) -> Drain:
    """Send ``count`` messages due together ``lead`` s from now, while idle workers run
    (started by the caller); wait until all are acked.

    The send must finish before the due time, or the workers would start early: the lead
    doubles until it does. The server's CPU time counts from the send to the last ack
    (``redis_cpu_us_per_message``), and again from the due time (the drain's own figures);
    ``cpu`` reads the workers' CPU time so far, in seconds. Until the due time this process
    sleeps; from it, it polls for the end, less often while much is left (see
    probes.wait_drained).
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
    # Asleep until the due time (on the Redis clock), then the drain's CPU readings.
    time.sleep(max(due_ms / 1000 - probes.server_time(probe_client) - 0.002, 0))
    at_due = probes.server_usage(probe_client)
    workers_at_due, probe_at_due = cpu() if cpu else 0.0, time.process_time()
    window_started = time.monotonic()
    finished, polls = probes.wait_drained(queue, poll, timeout=120 + count / 100, paced=True)
    probe_cpu = time.process_time() - probe_at_due
    workers_cpu = cpu() - workers_at_due if cpu else None
    used = probes.server_usage(probe_client)  # its commands since the reset
    window = time.monotonic() - window_started
    counts = used.calls
    acked, failed = probes.acked_and_failed(queue)
    if acked != count or failed:
        raise RuntimeError(f"drain acked {acked} of {count} messages, {failed} failed")
    for name, per_poll in probes.POLL_COMMANDS.items():
        counts[name] -= per_poll * polls * probes.polled_shards(queue)
    del counts["config|resetstat"]
    counts["info"] -= 1  # the reading at the due time, and the clock read before it
    counts["time"] -= 1
    seconds = finished - due_ms / 1000
    redis_cpu = used.cpu_seconds - at_due.cpu_seconds
    return Drain(
        rate=count / seconds,
        seconds=seconds,
        commands_per_message=sum(counts.values()) / count,
        scripts_per_message=probes.script_calls(counts) / count,
        redis_us_per_message=used.script_usec / count,
        redis_cpu_us_per_message=(used.cpu_seconds - before.cpu_seconds) * 1e6 / count,
        drain_redis_cpu_us_per_message=redis_cpu * 1e6 / count,
        workers_cpu_us_per_message=None if workers_cpu is None else workers_cpu * 1e6 / count,
        probe_cpu_us_per_message=probe_cpu * 1e6 / count,
        cores_busy=None if workers_cpu is None else (redis_cpu + workers_cpu + probe_cpu) / window,
    )
