"""The backends the engine's contract tests run on (the ``backend_url`` fixture's params)."""

from typing import Any

import pytest

from tests.redis_servers import default_binaries


def servers_are_valkey() -> bool:
    try:
        return default_binaries().name == "valkey"
    except RuntimeError:  # no server at all: the first test that needs one says so
        return False


# "valkey": the same tests on a private valkey-server, so the engine is proven on Valkey as
# well as Redis. Where the suite's servers are Valkey already (no redis-server, or
# DQ_TEST_SERVER=valkey), "standalone" is that run. "scripts": the standalone server, as a
# user it refuses Functions (FCALL and FUNCTION), as some managed services do: the queue's
# Lua then runs as EVALSHA scripts.
REDIS_BACKENDS = [
    "standalone",
    pytest.param("cluster", marks=pytest.mark.cluster),
    *([] if servers_are_valkey() else ["valkey"]),
    "scripts",
]
# The contract again on a queue spread over shards (engine.sharding.store): 6 on the
# Cluster (two a master), 4 in memory.
SHARDED_BACKENDS = [
    pytest.param("sharded-cluster", marks=pytest.mark.cluster),
    "sharded-memory",
]
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "sharded-cluster": {"SHARDS": 6},
    "sharded-memory": {"SHARDS": 4},
}

# The tests of what holds within one shard (one script call's bounds, the order of a
# queue, announcements against the workers' one plan) run on every backend but these.
one_shard = pytest.mark.parametrize("backend_url", [*REDIS_BACKENDS, "memory"], indirect=True)
