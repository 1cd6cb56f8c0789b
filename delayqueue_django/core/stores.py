"""Building a queue's store from its settings: Redis (a django-redis alias or a URL), or the
in-process memory store for ``memory://`` URLs; spread over shards with ``SHARDS``."""

from dataclasses import replace

from delayqueue_django.core import connections
from delayqueue_django.core.queue_config import QueueConfig
from delayqueue_django.engine import QueueKeys, RedisStore, Store, StoreLimits
from delayqueue_django.engine.flow import cap_share, rate_share
from delayqueue_django.engine.memory import MemoryStore, get_server
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.sharded_store import ShardedStore


def store_for(config: QueueConfig) -> Store:
    keys = QueueKeys(config.key_prefix, config.name)
    queue_limits = StoreLimits(
        consume_ms=config.max_consume_ms,
        stage_limit=config.stage_batch_size,
        send_batch_size=config.send_batch_size,
    )

    def limits(shard: QueueKeys) -> StoreLimits:
        # Each shard enforces its share of the queue's flow gates (see engine.flow).
        return replace(
            queue_limits,
            rate_limit=rate_share(config.rate_limit, shard, config.shards),
            max_in_flight=cap_share(config.max_in_flight, shard, config.shards),
        )

    if config.memory_name is not None:
        server = get_server(config.memory_name)

        def make(shard: QueueKeys) -> ShardStore:
            return MemoryStore(server, shard, limits(shard))

    else:
        client = connections.client_for(config)

        def make(shard: QueueKeys) -> ShardStore:
            return RedisStore(client, shard, limits(shard))

    # Even a queue of one shard: it still drains, finds and counts what a layout of more
    # shards left, if it had one (see engine.shard_layouts).
    return ShardedStore(make(keys), config.shards, make)
