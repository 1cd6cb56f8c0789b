"""An A/B of the Lua's time in Redis per call: ``python -m benchmarks.lua_ab TREE...``.

Each tree is a checkout of this project (``git worktree add`` or ``git archive | tar -x``
of a commit); its ``engine/lua`` is loaded as a Functions library of its own name, as the
store builds it, on one private Redis, beside the others. Each round runs, tree after tree
(the order reversed every other round, so a change in the machine's load falls on every
tree), ``--calls`` calls of each case on a queue of the tree's own, emptied first:

- ``send``: a plain send of one message, delayed an hour (as ``send(payload, delay=...)``);
- ``fetch, empty``: a fetch of count 1, with a request id, from a queue with nothing due;
- the trickle's cycle, one message at a time: a send due now, a fetch of count 1 with a
  request id, its ack with a request id, ``plain`` and ``untracked`` (as a worker makes
  them), each call's time read from ``SLOWLOG`` (``slowlog-log-slower-than 0``); with
  ``--pause`` seconds after each call, as calls come at a trickle, when Redis has gone
  cold between them (its caches, the CPU's, taken by other processes).

The figure is Redis's time inside the ``FCALL`` (``INFO commandstats`` usec per call for
the first two; the SLOWLOG's median for the cycle's), the median of the rounds; the ratio
in brackets is the median of each round's ratio to the first tree in that round.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.redis_servers import RedisServer

CASES = ("send", "fetch, empty", "send, due now", "fetch, one due", "ack")
PARTS = ("pending", "ready", "unack", "retry", "garbage", "payload", "meta", "exhausted")
LAYOUT_PARTS = (*PARTS, "quarantine", "throughput")
PAYLOAD = json.dumps({"task": "benchmarks.handlers.noop", "args": [1, 2], "kwargs": {}})


def library_of(tree: Path, name: str) -> str:
    """The tree's library as engine/scripts.py builds it, under ``name``."""
    folder = tree / "delayqueue_django" / "engine" / "lua"
    scripts = (tree / "delayqueue_django" / "engine" / "scripts.py").read_text("utf-8")
    namespace: dict[str, Any] = {"__name__": "lua_ab_scripts", "__package__": None}
    # The tree's own scripts.py builds its library: our own checkout, run as it would be.
    exec(compile(scripts, "scripts.py", "exec"), namespace)
    namespace["_read"] = lambda script: (folder / f"{script}.lua").read_text("utf-8")
    built: str = namespace["_library"](name)
    return built


class Tree:
    def __init__(self, client: redis.Redis, tree: Path, index: int) -> None:
        self.client: Any = client
        self.name = f"lua_ab_{index}"
        client.function_load(library_of(tree, self.name), replace=True)
        tag = "{" + f"lua_ab:{index}" + "}"
        self.layout = [f"{tag}:{part}" for part in LAYOUT_PARTS]
        self.channel = f"{tag}:wakeup"
        self.fetch_keys = [*self.layout, f"{tag}:fetch:w"]
        self.ack_keys = [*self.layout, f"{tag}:commit:w"]
        self.serial = 0

    def call(self, function: str, keys: list[str], *args: object) -> Any:
        return self.client.execute_command(
            "FCALL", f"{self.name}_{function}", len(keys), *keys, *args
        )

    def send(self, delay_us: int) -> str:
        self.serial += 1
        message = f"m{self.serial}"
        self.call("send", self.layout[:1], self.channel, 1, message, "", delay_us, 3, PAYLOAD)
        return message

    def send_later(self) -> str:
        return self.send(3_600_000_000)

    def fetch(self) -> Any:
        self.serial += 1
        request = f"f{self.serial}"
        return self.call("fetch", self.fetch_keys, self.channel, 1, 30000, 1000, request, "", 0, "")

    def clear(self) -> None:
        self.client.delete(*self.layout, *self.fetch_keys[-1:], *self.ack_keys[-1:])


def per_call(client: redis.Redis, calls: int, run: Callable[[], object]) -> float:
    client.config_resetstat()
    for _ in range(calls):
        run()
    return float(client.info("commandstats")["cmdstat_fcall"]["usec_per_call"])


def cycle(client: redis.Redis, tree: Tree, calls: int, pause: float) -> dict[str, float]:
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 3 * calls + 10)
    client.slowlog_reset()
    for _ in range(calls):
        message = tree.send(0)
        time.sleep(pause)
        reply = tree.fetch()
        time.sleep(pause)
        assert reply[3][0] == message.encode(), reply
        tree.serial += 1
        acked = tree.call(
            "ack", tree.ack_keys, f"a{tree.serial}", 30000, 1, message, reply[3][3],
            "plain", "untracked",
        )  # fmt: skip
        assert acked[0] == [message.encode()], acked
        time.sleep(pause)
    times: dict[str, list[int]] = {"send": [], "fetch": [], "ack": []}
    for entry in client.slowlog_get(3 * calls + 10):
        command = entry["command"].split()
        if command[0].lower() == b"fcall":
            times[command[1].decode().rsplit("_", 1)[1]].append(entry["duration"])
    client.config_set("slowlog-log-slower-than", 10000)
    return {
        "send, due now": statistics.median(times["send"]),
        "fetch, one due": statistics.median(times["fetch"]),
        "ack": statistics.median(times["ack"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts of the project")
    parser.add_argument("--calls", type=int, default=300, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=30, help="rounds (30)")
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds after each call of the cycle (0)"
    )
    options = parser.parse_args()
    server = RedisServer()
    try:
        client = server.client()
        trees = [Tree(client, tree, index) for index, tree in enumerate(options.trees)]
        figures: dict[tuple[int, str], list[float]] = {}
        for round_ in range(options.rounds):
            for index in range(len(trees))[:: 1 if round_ % 2 == 0 else -1]:
                tree = trees[index]
                tree.clear()
                found = {"send": per_call(client, options.calls, tree.send_later)}
                tree.clear()
                found["fetch, empty"] = per_call(client, options.calls, tree.fetch)
                tree.clear()
                found.update(cycle(client, tree, options.calls, options.pause))
                for case, value in found.items():
                    figures.setdefault((index, case), []).append(value)
        print("| tree | " + " | ".join(CASES) + " |")
        print("| --- |" + " --- |" * len(CASES))
        for index, tree_path in enumerate(options.trees):
            cells = []
            for case in CASES:
                mine, first = figures[(index, case)], figures[(0, case)]
                ratio = statistics.median(a / b for a, b in zip(mine, first, strict=True))
                cells.append(f"{statistics.median(mine):.1f} µs ({ratio:.2f})")
            print(f"| {tree_path} | " + " | ".join(cells) + " |")
    finally:
        server.close()


if __name__ == "__main__":
    main()
