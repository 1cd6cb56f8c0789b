"""Scale: a million pending messages. Send latency with the queue empty and full, what
each pending message costs in Redis memory, and a crowd of messages falling due in the
same second while the million wait: all delivered, and the longest single script call."""

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks import probes
from benchmarks.send import DELAY
from delayqueue_django import Outgoing, get_queue
from delayqueue_django.engine.scripts import SCRIPT_NAMES, library, source

FILL_CHUNK = 10_000


@dataclass(frozen=True)
class Memory:
    per_message: float  # used_memory growth per pending message, less its payload
    payload_bytes: float  # the average payload's JSON length
    by_key: dict[str, float]  # MEMORY USAGE per message of each structure


@dataclass(frozen=True)
class Fill:
    memory: Memory
    rate: float  # messages per second, in send_many calls of FILL_CHUNK
    longest_send_ms: float  # the longest send script call (one SEND_BATCH_SIZE chunk)


def fill(count: int, probe_client: Any) -> Fill:
    """Add ``count`` pending messages."""
    queue = get_queue()
    before = probes.used_memory(probe_client)
    probes.track_script_latency(probe_client)
    payload_bytes = 0
    started = time.perf_counter()
    for first in range(0, count, FILL_CHUNK):
        payloads = [{"n": n} for n in range(first, min(first + FILL_CHUNK, count))]
        payload_bytes += sum(len(json.dumps(p, separators=(",", ":"))) for p in payloads)
        queue.send_many(payloads, delay=DELAY)
    rate = count / (time.perf_counter() - started)
    longest_send_ms = probes.script_latency_ms(probe_client)["p100"]
    grown = probes.used_memory(probe_client) - before
    keys = queue.store.keys
    # (No meta key at all: a message has no meta record until it is handed out.)
    by_key = {
        part: int(probe_client.memory_usage(keys.key(part), samples=0) or 0) / count
        for part in ("pending", "payload", "meta")
    }
    memory = Memory(
        per_message=(grown - payload_bytes) / count,
        payload_bytes=payload_bytes / count,
        by_key=by_key,
    )
    return Fill(memory, rate, longest_send_ms)


@dataclass(frozen=True)
class Crowd:
    seconds: float  # from the first due time to the last ack
    longest_call_ms: float  # the longest script call (Redis latency tracking, p100)
    p999_call_ms: float
    slow_calls: dict[str, int]  # script calls over SLOW_CALL_MS, by script


# SLOWLOG keeps calls slower than this, to name the scripts behind the longest ones. Not 0:
# Redis 7 logs the commands run inside scripts too, and logging every one of them would
# slow the scripts down and flood the log.
SLOW_CALL_MS = 1


def crowd(count: int, probe_client: Any, fill_rate: float) -> Crowd:
    """``count`` messages due within one second, with a worker running (the caller's):
    wait until all are acked; how long script calls took comes from Redis's own latency
    tracking (INFO latencystats, every call) and its SLOWLOG."""
    queue = get_queue()
    acked_before, _ = probes.acked_and_failed(queue)
    # Due once the send is surely over, so the whole crowd waits in pending first.
    due_ms = round((probes.server_time(probe_client) + 1 + 2 * count / fill_rate) * 1000)
    queue.send_many(
        [
            Outgoing({"n": n}, at=datetime.fromtimestamp((due_ms + n * 1000 // count) / 1000, UTC))
            for n in range(count)
        ]
    )
    if probes.server_time(probe_client) * 1000 >= due_ms:
        raise RuntimeError("the crowd's send was not over before its due time")
    probe_client.config_set("slowlog-log-slower-than", SLOW_CALL_MS * 1000)
    probe_client.config_set("slowlog-max-len", 100_000)
    probe_client.slowlog_reset()
    probes.track_script_latency(probe_client)
    deadline = time.monotonic() + 120 + count / 1000
    while (acked := probes.acked_and_failed(queue)[0] - acked_before) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {acked} of {count} messages due together were acked")
        time.sleep(0.02)
    finished = time.time()
    latency = probes.script_latency_ms(probe_client)
    # Calls name their script: FCALL by its function, EVALSHA (where Redis refuses
    # Functions) by its script's SHA.
    names = {library().function(name): name for name in SCRIPT_NAMES}
    names |= {hashlib.sha1(source(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}
    slow_calls: Counter[str] = Counter()
    for entry in probe_client.slowlog_get(100_000):
        words = entry["command"].split()
        if words[0].upper() in (b"FCALL", b"FCALL_RO", b"EVALSHA"):
            slow_calls[names.get(words[1].decode(), "other")] += 1
    _, failed = probes.acked_and_failed(queue)
    if failed:
        raise RuntimeError(f"{failed} deliveries failed while the crowd was handled")
    return Crowd(
        seconds=finished - due_ms / 1000,
        longest_call_ms=latency["p100"],
        p999_call_ms=latency["p99.9"],
        slow_calls=dict(slow_calls),
    )
