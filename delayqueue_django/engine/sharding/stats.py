"""Stats over the shards of a queue: each shard's read one round trip each (a server that
did not answer is not asked again for its other shards), and added up."""

from collections.abc import Mapping, Sequence

from redis.exceptions import RedisError

from delayqueue_django.engine.errors import is_outage
from delayqueue_django.engine.protocol import ShardStore

# Counts that add up across shards; the other stats are times or flags (see combined_stats).
_TIMES = ("server_time_ms", "next_due_ms", "lag_ms", "paused")


def combined_stats(per_shard: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Stats over shards: counts and totals add up; the latest server time, the earliest
    next due time (-1: none pending anywhere), the largest lag; paused if any is."""
    combined: dict[str, int] = {}
    for stats in per_shard:
        for name, value in stats.items():
            if name not in _TIMES:
                combined[name] = combined.get(name, 0) + value
    if per_shard:
        combined["server_time_ms"] = max(stats["server_time_ms"] for stats in per_shard)
        next_due = [stats["next_due_ms"] for stats in per_shard if stats["next_due_ms"] >= 0]
        combined["next_due_ms"] = min(next_due) if next_due else -1
        combined["lag_ms"] = max(stats["lag_ms"] for stats in per_shard)
        # Paused is a flag: set on every shard together (see ShardedStore.flow).
        combined["paused"] = max(stats.get("paused", 0) for stats in per_shard)
    return combined


def partial_stats(answered: Sequence[Mapping[str, int]], shards: int) -> dict[str, int]:
    """The stats of the shards that answered, added up (see combined_stats), and
    ``shards_down``: how many of the queue's ``shards`` did not."""
    return {**combined_stats(answered), "shards_down": shards - len(answered)}


def read_stats(
    stores: Mapping[str, ShardStore],
) -> dict[str, dict[str, int] | RedisError | OSError]:
    """Each shard's stats, by shard name, one round trip each; or the error of a shard
    that could not be read. A server that did not answer is not asked again for its other
    shards: they get its error (each would wait out its own socket timeout, as in
    ShardedStore.hold_siblings)."""
    read: dict[str, dict[str, int] | RedisError | OSError] = {}
    silent: dict[str, RedisError | OSError] = {}  # server_name() -> its error
    for name, store in stores.items():
        server = store.server_name()
        if server in silent:
            read[name] = silent[server]
            continue
        try:
            read[name] = store.stats()
        except (RedisError, OSError) as error:
            read[name] = error
            if is_outage(error):  # not a refusal: its other shards would fail alike
                silent[server] = error
    return read
