"""The flow gates' benchmark (docs/guides/flow-control.md): a drain under RATE_LIMIT, whose
rate over the whole run is compared with the limit, and the Redis cost per message of a
queue with a rate limit or a cap that never binds (their bookkeeping alone) beside a plain
queue's; and the same on a sharded queue, whose gates hold with one budget on shard 0
(engine.flow: a reservation per fetch, and under the cap a call per ack batch) beside a
plain sharded queue's."""

import json
import math

PLAIN = "plain queue"
SHARDS = 4
SHARDED_PLAIN = f"SHARDS {SHARDS}, plain queue"
# The queue options each cost row's workers run with: limits far above what a drain
# reaches, so that only their bookkeeping shows.
COST_OPTIONS: dict[str, dict[str, object]] = {
    PLAIN: {},
    "RATE_LIMIT (not binding)": {"RATE_LIMIT": "1000000/s"},
    "MAX_IN_FLIGHT (not binding)": {"MAX_IN_FLIGHT": 1_000_000},
    SHARDED_PLAIN: {"SHARDS": SHARDS},
    f"SHARDS {SHARDS}, RATE_LIMIT (not binding)": {"SHARDS": SHARDS, "RATE_LIMIT": "1000000/s"},
    f"SHARDS {SHARDS}, MAX_IN_FLIGHT (not binding)": {"SHARDS": SHARDS, "MAX_IN_FLIGHT": 1_000_000},
}


def queue_env(options: dict[str, object]) -> dict[str, str]:
    """The workers' environment for these queue options (see benchmarks/settings.py)."""
    return {"DQ_BENCH_QUEUE": json.dumps(options)}


def accuracy_percent(messages: int, seconds: float, limit_per_second: int) -> float:
    """What a drain handed out, as a share of the most the limit allows in its time (100:
    exactly the limit). Within a span of ``seconds``, a window of one second slides over
    ``floor(seconds) + 1`` whole windows' worth: the first window's messages go out at
    once, and the last ones a second after the window before them."""
    return 100 * messages / ((math.floor(seconds) + 1) * limit_per_second)


def baseline(name: str) -> str:
    """The row a cost row is compared with: the plain queue of its kind."""
    return SHARDED_PLAIN if "SHARDS" in name else PLAIN
