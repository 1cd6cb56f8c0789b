"""What a process knows of one shard of a sharded queue: the record its fetch plan keeps
per shard (see engine.sharding.fetch)."""

import math
from dataclasses import dataclass


@dataclass
class ShardPlan:
    """What this process knows of one shard."""

    # When the shard next has work, on its own clock (ms): -inf to look at once (unknown,
    # or work waiting), inf when it holds nothing that will come due (empty).
    due_ms: float = -math.inf
    # The earliest wake-up heard since the shard's last fetch began: a fetch's reply may
    # predate it, and must not erase it.
    heard_ms: float = math.inf
    # Its last fetch (False before any), and when the last was asked for (monotonic s).
    fetched: bool = False
    asked_at: float = -math.inf
    # Its last fetch said an exhaustion is owed.
    owed: bool = False
    # While its fetches fail: since when, and not to be tried again before (monotonic s).
    failing_since: float | None = None
    retry_at: float = -math.inf
    # Its server did not answer in time: not asked until a probe of it answers
    # (engine.sharding.hangs), retry_at then the time of the next probe.
    held: bool = False
