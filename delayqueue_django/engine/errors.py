"""Errors raised by the Redis protocol layer."""

from redis.exceptions import OutOfMemoryError


class DelayQueueError(Exception):
    """Base class of every error raised by delayqueue_django."""


class DuplicateMessageId(DelayQueueError):
    """A message id given to send is already known to the queue; nothing was written."""


class UnsupportedRedisVersion(DelayQueueError):
    """The Redis server is older than the oldest version the scripts run on."""


class RedisOutOfMemory(DelayQueueError, OutOfMemoryError):
    """Redis refused to store messages: it is over its maxmemory and may not evict keys
    (noeviction); nothing was written. Still a redis ``OutOfMemoryError``."""
