"""An A/B of a send's CPU: ``python -m benchmarks.send_ab TREE...``.

Each tree is a checkout of this project (``git worktree add`` or ``git archive | tar -x``
of a commit). On one private Redis, each tree's ``delayqueue_django.send(payload,
delay=...)`` and ``asend`` are timed in a process of its own (PYTHONPATH the tree), beside
huey's enqueue of a delayed task in the same process when huey is installed: bursts of
``--messages`` calls of each in turn, ``--bursts`` times, the trees' processes one after
the other, ``--rounds`` times (interleaved, so a change in the machine's load falls on every
tree). Each figure is the producer's CPU time (process time) per call, the median of its
bursts, then of its rounds; CPU time is steadier than wall time on a shared machine.
Prints one Markdown table; its last column is the median of each burst's send ÷ the huey
burst after it in the same process.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tests.redis_servers import RedisServer

# Run in each tree's process: {"send": [...], "asend": [...], "huey": [...]}, µs per call
# of each burst.
_MEASURE = """
import asyncio, json, os, sys, time
import django
django.setup()
import delayqueue_django
count, bursts = int(sys.argv[1]), int(sys.argv[2])

def send():
    for n in range(count):
        delayqueue_django.send({"order": n}, delay=3600)

async def _asend():
    for n in range(count):
        await delayqueue_django.asend({"order": n}, delay=3600)

loop = asyncio.new_event_loop()
kinds = {"send": send, "asend": lambda: loop.run_until_complete(_asend())}
try:
    from huey import RedisHuey
except ImportError:
    pass
else:
    huey = RedisHuey("send_ab", url=os.environ["DQ_BENCH_REDIS_URL"])
    task = huey.task()(lambda payload: None)

    def enqueue():
        for n in range(count):
            task.schedule(args=({"order": n},), delay=3600)

    kinds["huey"] = enqueue
for run in kinds.values():
    run()  # warm: the first calls build clients and load the functions
found = {name: [] for name in kinds}
for _ in range(bursts):
    for name, run in kinds.items():
        started = time.process_time()
        run()
        found[name].append((time.process_time() - started) * 1e6 / count)
print(json.dumps(found))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.send_ab", description=__doc__)
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts of the project")
    parser.add_argument("--messages", type=int, default=500, help="calls per burst (500)")
    parser.add_argument("--bursts", type=int, default=20, help="bursts per process (20)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree (3)")
    args = parser.parse_args(argv)
    server = RedisServer()
    probe = server.client()
    medians: dict[Path, dict[str, list[float]]] = {tree: {} for tree in args.trees}
    try:
        for _ in range(args.rounds):
            for tree in args.trees:
                probe.flushall()
                env = {
                    **os.environ,
                    "PYTHONPATH": str(tree.resolve()),
                    "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
                    "DQ_BENCH_REDIS_URL": server.url,
                }
                done = subprocess.run(
                    [sys.executable, "-c", _MEASURE, str(args.messages), str(args.bursts)],
                    env=env,
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                found = json.loads(done.stdout)
                for name, values in found.items():
                    medians[tree].setdefault(name, []).append(statistics.median(values))
                if "huey" in found:
                    # Each burst's send beside the huey burst after it, in one process.
                    pairs = zip(found["send"], found["huey"], strict=True)
                    ratio = statistics.median(send / huey for send, huey in pairs)
                    medians[tree].setdefault("send/huey", []).append(ratio)
    finally:
        probe.close()
        server.close()
    print("| tree | send() µs CPU | asend() µs CPU | huey enqueue µs CPU | send ÷ huey |")
    print("| --- | --- | --- | --- | --- |")
    for tree, found in medians.items():
        send, asend = statistics.median(found["send"]), statistics.median(found["asend"])
        huey = statistics.median(found["huey"]) if "huey" in found else None
        ratio = "" if huey is None else f"{statistics.median(found['send/huey']):.2f}"
        shown = "" if huey is None else f"{huey:.1f}"
        print(f"| {tree} | {send:.1f} | {asend:.1f} | {shown} | {ratio} |")


if __name__ == "__main__":
    main()
