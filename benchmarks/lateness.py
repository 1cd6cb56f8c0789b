"""How late handlers start: messages with delays spread over a few seconds, one worker.

    .venv/bin/python benchmarks/lateness.py [--messages 500] [--spread 5] [--runs 3]

Starts a private redis-server, runs a worker (in this process, one handler thread) and
reports handler start minus due time: p50 / p99 / max over all runs, in milliseconds.
The due time is computed by the producer on this machine's clock, as is the handler's
start, so both sides read the same clock.
"""

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * fraction), len(ordered) - 1)]


def one_run(url: str, messages: int, spread: float) -> list[float]:
    from django.test import override_settings

    from delayqueue_django import get_queue
    from delayqueue_django.message import Message
    from delayqueue_django.worker import Worker

    lateness: list[float] = []
    done = threading.Event()

    def handler(message: Message) -> None:
        lateness.append((time.time() - message.payload["due"]) * 1000)
        if len(lateness) == messages:
            done.set()

    with override_settings(DELAYQUEUES={"default": {"URL": url}}):
        queue = get_queue()
        queue.store.client.flushall()
        worker = Worker([(queue, handler)])
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        time.sleep(0.5)
        step = spread / messages
        for n in range(messages):
            delay = 0.2 + n * step
            queue.send({"due": time.time() + delay}, delay=delay)
            time.sleep(step / 4)
        done.wait(timeout=spread + 30)
        worker.request_stop()
        thread.join(timeout=10)
    return lateness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--spread", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import django

    django.setup()
    from tests.redis_servers import RedisServer

    server = RedisServer()
    try:
        all_values: list[Any] = []
        for run in range(args.runs):
            values = one_run(server.url, args.messages, args.spread)
            all_values += values
            print(
                f"run {run + 1}: {len(values)} messages, p50 {statistics.median(values):.2f} ms, "
                f"p99 {percentile(values, 0.99):.2f} ms, max {max(values):.2f} ms"
            )
        print(
            f"| lateness ({os.cpu_count()} cores) | p50 {statistics.median(all_values):.2f} ms "
            f"| p99 {percentile(all_values, 0.99):.2f} ms | max {max(all_values):.2f} ms |"
        )
    finally:
        server.close()


if __name__ == "__main__":
    main()
