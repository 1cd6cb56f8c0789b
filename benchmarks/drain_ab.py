"""An A/B of the drain: ``python -m benchmarks.drain_ab TREE...``.

Each tree is a checkout of this project (``git worktree add`` or ``git archive | tar -x``
of a commit). On one private Redis, ``--messages`` messages due at one instant are drained
by one worker process of one tree (``run_delayqueue`` at concurrency 1, the no-op handler,
PYTHONPATH the tree), as the drain benchmark does (benchmarks/drain.py); the trees one
after the other, ``--rounds`` times (interleaved, so a change in the machine's load falls
on every tree). The messages are sent by this process with the tree it runs in (run it
with PYTHONPATH one of the trees): the send is not measured. Each figure is a median of
the rounds: the drain rate (due time to the last ack) and the worker process's time on a
CPU per message over the same span (its threads' /proc schedstat, to the nanosecond),
steadier than wall time on a shared machine; and the median of each round's ratio to the
first tree's.
"""

import argparse
import os
import statistics
from pathlib import Path

from tests.redis_servers import RedisServer

NOOP = "benchmarks.handlers.noop"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drain_ab", description=__doc__)
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts of the project")
    parser.add_argument("--messages", type=int, default=20_000, help="per drain (20000)")
    parser.add_argument("--rounds", type=int, default=5, help="drains per tree (5)")
    args = parser.parse_args(argv)
    server = RedisServer()
    os.environ["DQ_BENCH_REDIS_URL"] = server.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from benchmarks import drain, workers

    probe = server.client()
    found: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in args.trees}
    try:
        for round_ in range(args.rounds):
            for tree in args.trees:
                workers.ROOT = tree.resolve()  # where the worker process runs from
                with workers.WorkerProcesses(1, server.url, NOOP) as running:
                    drained = drain.drain(args.messages, probe, cpu=running.tree_cpu_seconds)
                cpu = drained.workers_cpu_us_per_message or 0.0
                found[tree].append((drained.rate, cpu))
                print(
                    f"round {round_ + 1}/{args.rounds} {tree}: {drained.rate:,.0f} msg/s, "
                    f"worker CPU {cpu:.1f} µs per message",
                    flush=True,
                )
    finally:
        probe.close()
        server.close()
    first = found[args.trees[0]]
    print("| tree | drain msg/s | ÷ first tree's | worker CPU µs per message | ÷ first tree's |")
    print("| --- | --- | --- | --- | --- |")
    for tree, runs in found.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        rate_ratio = statistics.median(r / f for (r, _), (f, _) in zip(runs, first, strict=True))
        cpu_ratio = statistics.median(c / f for (_, c), (_, f) in zip(runs, first, strict=True))
        print(f"| {tree} | {rate:,.0f} | {rate_ratio:.2f} | {cpu:.1f} | {cpu_ratio:.2f} |")


if __name__ == "__main__":
    main()
