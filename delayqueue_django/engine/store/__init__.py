"""The store: one queue's state in Redis, changed only through the Lua scripts.

Every public method is one round trip (a bulk send on Redis Cluster is one per chunk) and
one atomic step per script call; no client-side locks, so any number of producers and
consumers may share a queue.

``RedisStore`` is built from parts, one family of calls each (as the memory store is split
by the family of scripts each mirrors), so that a family reads in one place: producing,
consuming, flow, layouts, operating, schedules and side_records, all over ``base`` (the
client, the keys, the scripts). ``calls`` builds the scripts' arguments and ``replies``
reads their replies, apart from the parts because ``AsyncRedisStore`` shares them.
"""

from delayqueue_django.engine.store.consuming import RedisConsuming
from delayqueue_django.engine.store.flow import RedisFlow
from delayqueue_django.engine.store.layouts import RedisLayouts
from delayqueue_django.engine.store.operating import RedisOperating
from delayqueue_django.engine.store.producing import RedisProducing
from delayqueue_django.engine.store.schedules import RedisSchedules
from delayqueue_django.engine.store.side_records import RedisSideRecords


class RedisStore(
    RedisProducing,
    RedisConsuming,
    RedisFlow,
    RedisLayouts,
    RedisOperating,
    RedisSchedules,
    RedisSideRecords,
):
    """One queue's state in Redis."""


__all__ = ["RedisStore"]
