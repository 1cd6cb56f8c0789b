"""Building a queue's store from its settings: Redis (a django-redis alias or a URL), or the
in-process memory store for ``memory://`` URLs; spread over shards with ``SHARDS``."""

from delayqueue_django.core import connections
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.engine import QueueKeys, RedisStore, Store, StoreLimits
from delayqueue_django.engine.memory import MemoryStore, get_server
from delayqueue_django.engine.protocol import ShardStore
from delayqueue_django.engine.sharding.store import ShardedStore


def store_for(config: QueueConfig) -> Store:
    keys = QueueKeys(config.key_prefix, config.name)
    # Every shard has the queue's flow gates: a queue of one shard enforces them in its
    # fetch, a sharded one on shard 0 for the whole queue (see engine.flow).
    limits = StoreLimits(
        consume_ms=config.max_consume_ms,
        stage_limit=config.stage_batch_size,
        send_batch_size=config.send_batch_size,
        rate_limit=config.rate_limit,
        max_in_flight=config.max_in_flight,
        history_attempts=config.history_attempts,
    )

    if config.memory_name is not None:
        server = get_server(config.memory_name)

        def make(shard: QueueKeys) -> ShardStore:
            return MemoryStore(server, shard, limits)

    else:
        client = connections.client_for(config)

        def make(shard: QueueKeys) -> ShardStore:
            return RedisStore(client, shard, limits)

    # Even a queue of one shard: it still drains, finds and counts what a layout of more
    # shards left, if it had one (see engine.sharding.layouts).
    return ShardedStore(make(keys), config.shards, make)
