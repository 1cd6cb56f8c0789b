"""The Redis protocol of the queue: key layout, Lua scripts and the store that runs them.

Nothing in this package imports Django; ``delayqueue_django.queue`` wraps it with settings,
JSON encoding and the public API.
"""

from delayqueue_django.engine.errors import (
    DelayQueueError,
    DuplicateMessageId,
    RedisOutOfMemory,
    UnsupportedRedisVersion,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.records import (
    Delivery,
    ExhaustedClaim,
    FetchResult,
    NackOutcome,
    NewMessage,
    StoredMessage,
)
from delayqueue_django.engine.store import STATES, RedisStore, StoreLimits

__all__ = [
    "STATES",
    "DelayQueueError",
    "Delivery",
    "DuplicateMessageId",
    "ExhaustedClaim",
    "FetchResult",
    "NackOutcome",
    "NewMessage",
    "QueueKeys",
    "RedisOutOfMemory",
    "RedisStore",
    "StoreLimits",
    "StoredMessage",
    "UnsupportedRedisVersion",
]
