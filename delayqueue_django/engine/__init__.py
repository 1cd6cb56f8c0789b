"""Where a queue's messages live: the ``Store`` protocol, the Redis store (key layout, Lua
scripts and the store that runs them) and the in-memory store (``engine.memory``).

Nothing in this package imports Django; ``delayqueue_django.core.queue`` wraps it with settings,
JSON encoding and the public API.
"""

from delayqueue_django.engine.errors import (
    DelayQueueError,
    DuplicateKey,
    DuplicateMessageId,
    InvalidExpiry,
    RedisOutOfMemory,
    UnsupportedRedisVersion,
)
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.protocol import Store, WakeupSubscription
from delayqueue_django.engine.records import (
    BURY,
    EXPIRED,
    LEASE_EXPIRED,
    POSTPONED_TOO_OFTEN,
    STATES,
    VERDICTS,
    Attempt,
    Delivery,
    ExhaustedClaim,
    FetchResult,
    KeyedSent,
    NackOutcome,
    NewMessage,
    StoredMessage,
    StoreLimits,
    loggable,
    printable,
)
from delayqueue_django.engine.store import RedisStore

__all__ = [
    "BURY",
    "EXPIRED",
    "LEASE_EXPIRED",
    "POSTPONED_TOO_OFTEN",
    "STATES",
    "VERDICTS",
    "Attempt",
    "DelayQueueError",
    "Delivery",
    "DuplicateKey",
    "DuplicateMessageId",
    "ExhaustedClaim",
    "FetchResult",
    "InvalidExpiry",
    "KeyedSent",
    "NackOutcome",
    "NewMessage",
    "QueueKeys",
    "RedisOutOfMemory",
    "RedisStore",
    "Store",
    "StoreLimits",
    "StoredMessage",
    "UnsupportedRedisVersion",
    "WakeupSubscription",
    "loggable",
    "printable",
]
