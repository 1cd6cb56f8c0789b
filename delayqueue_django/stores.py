"""Building a queue's store from its settings: Redis (a django-redis alias or a URL), or the
in-process memory store for ``memory://`` URLs."""

from delayqueue_django import connections
from delayqueue_django.conf import QueueConfig
from delayqueue_django.engine import QueueKeys, RedisStore, Store, StoreLimits
from delayqueue_django.engine.memory import MemoryStore, get_server


def store_for(config: QueueConfig) -> Store:
    keys = QueueKeys(config.key_prefix, config.name)
    limits = StoreLimits(
        consume_ms=config.max_consume_ms,
        stage_limit=config.stage_batch_size,
        send_batch_size=config.send_batch_size,
    )
    if config.memory_name is not None:
        return MemoryStore(get_server(config.memory_name), keys, limits)
    return RedisStore(connections.client_for(config), keys, limits)
