"""Sending: one ``send()`` per message as a view would, and the bulk ``send_many``."""

import asyncio
import time
from typing import Any

import delayqueue_django
from benchmarks import probes
from benchmarks.probes import Monitored
from delayqueue_django import get_queue

# Far enough ahead that nothing falls due while the benchmark runs.
DELAY = 3600


def single_rate(count: int) -> float:
    """Messages per second, one ``delayqueue_django.send`` call each."""
    send = delayqueue_django.send
    started = time.perf_counter()
    for n in range(count):
        send({"order": n}, delay=DELAY)
    return count / (time.perf_counter() - started)


def single_cpu_us(count: int) -> float:
    """The producer's CPU time (process time) per ``delayqueue_django.send`` call."""
    send = delayqueue_django.send
    started = time.process_time()
    for n in range(count):
        send({"order": n}, delay=DELAY)
    return (time.process_time() - started) * 1e6 / count


def async_cpu_us(count: int) -> float:
    """The same for ``delayqueue_django.asend``, awaited one after the other on an event
    loop (the queue's URL gives it a redis.asyncio client)."""
    asend = delayqueue_django.asend

    async def sends() -> None:
        for n in range(count):
            await asend({"order": n}, delay=DELAY)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asend({"warm": True}))  # its client is built on first use
        started = time.process_time()
        loop.run_until_complete(sends())
        return (time.process_time() - started) * 1e6 / count
    finally:
        loop.close()


def ping_rate(count: int) -> float:
    """Round trips per second of a bare PING on the queue's own client: the floor under
    every single send, whatever the script does."""
    store: Any = get_queue().store  # a RedisStore: the benchmarks run on Redis
    ping = store.client.ping
    started = time.perf_counter()
    for _ in range(count):
        ping()
    return count / (time.perf_counter() - started)


def server_us_per_send(probe_client: Any, count: int) -> float:
    """Redis's own time (INFO commandstats) per single send's script call."""
    probe_client.config_resetstat()
    single_rate(count)
    used = probes.server_usage(probe_client)
    return used.script_usec / probes.script_calls(used.calls)


def bulk_rate(count: int) -> float:
    """Messages per second through one ``send_many`` call of ``count`` payloads."""
    payloads = [{"order": n} for n in range(count)]
    queue = get_queue()
    started = time.perf_counter()
    queue.send_many(payloads, delay=DELAY)
    return count / (time.perf_counter() - started)


def latencies_ms(count: int) -> list[float]:
    """How long each of ``count`` single sends took."""
    send = delayqueue_django.send
    clock = time.perf_counter
    samples = []
    for n in range(count):
        started = clock()
        send({"order": n}, delay=DELAY)
        samples.append((clock() - started) * 1000)
    return samples


def round_trips_per_send(probe_client: Any, count: int = 100) -> float:
    """Commands the client sent to Redis per ``send()`` (seen by MONITOR)."""
    get_queue().send({"warm": True})  # the first call also checks the server's version
    with Monitored(probe_client) as monitored:
        for n in range(count):
            delayqueue_django.send({"order": n}, delay=DELAY)
    return sum(monitored.client_commands.values()) / count
