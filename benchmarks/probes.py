"""Reading what Redis itself counts: commands, memory, the slow log, the queue's sizes."""

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.store import parts

# Every way a client runs server-side Lua: scripts (EVALSHA and kin) and functions (FCALL).
SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})


def script_calls(counts: Counter[str]) -> int:
    """Script and function calls among ``counts``, whichever commands the store uses."""
    return sum(counts[name] for name in SCRIPT_COMMANDS)


@dataclass(frozen=True)
class ServerUsage:
    """What the server has spent so far: CPU time (INFO cpu, the whole process: every thread,
    busy or idle) and calls and µs per command since the last CONFIG RESETSTAT (INFO
    commandstats). Commands run inside Lua are counted too, under their own names; the
    scripts and functions under SCRIPT_COMMANDS, their time including their commands'."""

    cpu_seconds: float
    calls: Counter[str]
    usec: Counter[str]

    def since(self, before: "ServerUsage") -> "ServerUsage":
        return ServerUsage(
            self.cpu_seconds - before.cpu_seconds,
            self.calls - before.calls,
            self.usec - before.usec,
        )

    @property
    def script_usec(self) -> int:
        return sum(self.usec[name] for name in SCRIPT_COMMANDS)


def server_usage(client: Any) -> ServerUsage:
    """One INFO call, so a difference of two readings holds exactly one INFO of its own (a
    command's statistics are updated after it runs): ``probe_commands`` counts it."""
    info = client.info("cpu", "commandstats")
    stats = {
        name.removeprefix("cmdstat_"): row
        for name, row in info.items()
        if name.startswith("cmdstat_")
    }
    return ServerUsage(
        cpu_seconds=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        calls=Counter({name: int(row["calls"]) for name, row in stats.items()}),
        usec=Counter({name: int(row["usec"]) for name, row in stats.items()}),
    )


def track_script_latency(client: Any) -> None:
    """Start Redis's latency tracking of script calls afresh (it resets with the other
    statistics), reporting the median, p99, p99.9 and the longest (p100)."""
    client.config_set("latency-tracking-info-percentiles", "50 99 99.9 100")
    client.config_resetstat()


def script_latency_ms(client: Any) -> dict[str, float]:
    """Percentiles of script and function calls since track_script_latency, in ms (Redis's
    own timing of each call, from INFO latencystats, kept per command): for calls made with
    several commands (FCALL and FCALL_RO), the highest of each percentile."""
    stats = client.info("latencystats")
    found: dict[str, float] = {}
    for command in SCRIPT_COMMANDS:
        for name, usec in stats.get(f"latency_percentiles_usec_{command}", {}).items():
            found[name] = max(found.get(name, 0.0), float(usec) / 1000)
    return found


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def in_queue(queue: Queue) -> int:
    """Messages not yet acked: pending, staged (ready, retry) and in flight (unack), over
    every shard of the queue (one, unless it is sharded: see polled_shards).

    One pipelined round trip of four plain commands a shard (ZCARD, LLEN, LLEN, ZCARD), so
    the caller can subtract exactly what its polling cost from the command counts.
    """
    store: Any = queue.store  # always on one Redis here: the benchmarks run on one server
    pipe: Any = store.client.pipeline(transaction=False)
    for shard in parts(store).values():
        keys = shard.keys
        pipe.zcard(keys.key("pending"))
        pipe.llen(keys.key("ready"))
        pipe.llen(keys.key("retry"))
        pipe.zcard(keys.key("unack"))
    return sum(int(n) for n in pipe.execute())


def polled_shards(queue: Queue) -> int:
    """How many shards in_queue polls (POLL_COMMANDS each)."""
    return len(parts(queue.store))


POLL_COMMANDS = Counter({"zcard": 2, "llen": 2})


def probe_commands(polls: int, poll: Counter[str] = POLL_COMMANDS) -> Counter[str]:
    """What the probe itself sent over a window: one INFO (server_usage's second reading) and
    ``polls`` polls of ``poll`` commands each (in_queue's, by default)."""
    return Counter({"info": 1}) + Counter({name: n * polls for name, n in poll.items()})


# The longest pause between two polls of a paced wait (see wait_drained).
PACED_POLL_MAX_SECONDS = 0.02


def wait_drained(
    queue: Queue, interval: float, timeout: float, *, paced: bool = False
) -> tuple[float, int]:
    """Poll until nothing is left to ack; returns (time.time() when seen empty, polls made).

    ``paced``: poll every ``interval`` only near the end; before it, a third of the time
    the rest should take at the pace seen since the first poll (at most
    PACED_POLL_MAX_SECONDS). A drain on a 2-core machine shares the cores with this
    process: polling every 2 ms all through it took a tenth of a core (some 3 µs of CPU per
    message, besides the polls' own Redis time), taken from the workers and Redis it times.
    The end is still seen within ``interval``, or a third of the time left if the pace
    triples."""
    deadline = time.monotonic() + timeout
    polls = 0
    first: tuple[float, int] | None = None
    while True:
        polls += 1
        left = in_queue(queue)
        if left == 0:
            return time.time(), polls
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{in_queue(queue)} messages still not acked after {timeout} s")
        pause = interval
        if paced:
            if first is None:
                first = (now, left)
            elif first[1] > left:
                rest = left * (now - first[0]) / (first[1] - left)
                pause = min(max(interval, rest / 3), PACED_POLL_MAX_SECONDS)
        time.sleep(pause)


def acked_and_failed(queue: Queue) -> tuple[int, int]:
    """Deliveries acked and failed, from the queue's per-minute throughput counts."""
    rows = queue.throughput(60)
    return sum(row[1] for row in rows), sum(row[2] for row in rows)


def server_time(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


class Monitored:
    """Every command Redis receives while the block runs (MONITOR), for counting round trips:
    ``client_commands`` came from clients, ``script_commands`` ran inside Lua scripts."""

    _END = "delayqueue-benchmark-monitor-end"

    def __init__(self, client: Any) -> None:
        self.client = client
        # MONITOR holds a connection of its own, opened (and greeted) before it starts, so
        # the only command of ours it sees is the end marker.
        self._monitor_client: Any = redis.Redis(
            connection_pool=redis.ConnectionPool(
                **{**client.connection_pool.connection_kwargs, "socket_timeout": None}
            )
        )
        self.client_commands: Counter[str] = Counter()
        self.script_commands: Counter[str] = Counter()
        # The same as client_commands, a function call named by its function ("fcall
        # fetch"), for the idle phase's duties.
        self.client_calls: Counter[str] = Counter()
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def __enter__(self) -> "Monitored":
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        self._started.wait(5)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.client.echo(self._END)
        assert self._thread is not None
        self._thread.join(10)
        self._monitor_client.close()

    def _listen(self) -> None:
        with self._monitor_client.monitor() as monitor:
            self._started.set()
            for entry in monitor.listen():
                name = entry["command"].split(" ", 1)[0].lower()
                if name == "echo" and self._END in entry["command"]:
                    return
                if entry["client_type"] == "lua":
                    self.script_commands[name] += 1
                else:
                    self.client_commands[name] += 1
                    self.client_calls[_call_name(name, entry["command"])] += 1


def _call_name(name: str, command: str) -> str:
    """A command as the idle phase names it: a function call by its function, the library's
    prefix left out ("fcall fetch"); any other command by its name."""
    if not name.startswith("fcall"):
        return name
    words = command.split(" ", 2)
    # The library's functions are delayqueue_<version>_<script> (engine.scripts.Library).
    function = words[1].split("_", 2)[-1] if len(words) > 1 else ""
    return f"{name} {function}".strip()
