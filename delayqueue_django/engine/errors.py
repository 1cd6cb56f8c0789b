"""Errors raised by the Redis protocol layer."""


class DelayQueueError(Exception):
    """Base class of every error raised by delayqueue_django."""


class DuplicateMessageId(DelayQueueError):
    """A message id given to send is already known to the queue; nothing was written."""


class UnsupportedRedisVersion(DelayQueueError):
    """The Redis server is older than the oldest version the scripts run on."""
