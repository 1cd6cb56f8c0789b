"""What every part of ``Queue`` stands on: its settings, its store (built on first use),
where its Redis is, and the errors that say so."""

import functools
import threading
import weakref
from collections.abc import Callable, Coroutine
from functools import cached_property
from typing import Any, Concatenate, ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core import connections, features, stores
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.queue.key_options import check_key
from delayqueue_django.core.queue_schedules import QueueSchedules
from delayqueue_django.engine import Store
from delayqueue_django.engine.async_store import AsyncRedisStore
from delayqueue_django.engine.errors import QueueTimedOut, QueueUnavailable
from delayqueue_django.exceptions import ConflictingOptions

P = ParamSpec("P")
R = TypeVar("R")
Q = TypeVar("Q", bound="QueueBase")


def _reaching_redis(
    method: Callable[Concatenate[Q, P], R],
) -> Callable[Concatenate[Q, P], R]:
    """A Queue method whose Redis cannot be reached raises QueueUnavailable, which says
    where, instead of redis-py's error (its ``__cause__``)."""

    @functools.wraps(method)
    def call(queue: Q, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(queue, *args, **kwargs)
        except QueueUnavailable:
            raise
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error

    return call


def _areaching_redis(
    method: Callable[Concatenate[Q, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Q, P], Coroutine[Any, Any, R]]:
    """``_reaching_redis`` for the async methods."""

    @functools.wraps(method)
    async def call(queue: Q, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(queue, *args, **kwargs)
        except QueueUnavailable:
            raise
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise queue.unavailable(error) from error

    return call


def _check_id(message_id: Any) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise TypeError(f"message id must be a non-empty str, not {message_id!r}")
    return message_id


def _check_address(operation: str, message_id: Any, key: Any) -> tuple[str, bool]:
    """``(address, by_key)`` of a call that takes a message id or a key (exactly one),
    checked: the key (check_key) when ``by_key``, else the id."""
    if key is None:
        if message_id is None:
            raise TypeError(f"{operation}() needs a message id or key=")
        return _check_id(message_id), False
    if message_id is not None:
        raise ConflictingOptions(f"{operation}() takes a message id or key=, not both")
    return check_key(key), True


class QueueBase:
    """A queue's settings and store, which each part of ``Queue`` works through."""

    def __init__(self, config: QueueConfig, store: Store | None = None) -> None:
        self.config = config
        self.name = config.name
        # Redis, or the in-process memory store (see delayqueue_django.core.stores); built from
        # the settings on first use when not given (see store).
        self._store = store
        self._store_lock = threading.Lock()
        self._async_stores: weakref.WeakKeyDictionary[Any, AsyncRedisStore] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    @property
    def store(self) -> Store:
        """The queue's store, built on first use: a Redis Cluster client asks the cluster
        for its slots as it is built, which an outbox send, written to the database alone,
        must never wait for (nor fail on) while a master hangs."""
        store = self._store
        if store is None:
            with self._store_lock:
                if self._store is None:
                    self._store = self._build_store()
                store = self._store
        return store

    def _build_store(self) -> Store:
        """The store of the settings. A Redis Cluster client reads the cluster's slots as
        it is built: a cluster that cannot be reached raises QueueUnavailable, which names
        the queue, not redis-py's RedisClusterException."""
        try:
            return stores.store_for(self.config)
        except (RedisClusterException, RedisConnectionError, RedisTimeoutError) as error:
            # Where from the settings alone: ``address`` would read the store being built.
            where = connections.address(self.config)
            raise QueueUnavailable(
                f"queue {self.name!r} cannot reach Redis at {where}: {error}"
            ) from error

    @cached_property
    def address(self) -> str:
        """Where the queue's Redis is (host:port, …), for messages: never credentials."""
        return connections.address(self.config, getattr(self.store, "client", None))

    def unavailable(self, error: Exception) -> QueueUnavailable:
        """The package's error for redis-py's ConnectionError or TimeoutError on this queue."""
        if isinstance(error, RedisTimeoutError):
            return QueueTimedOut(
                f"queue {self.name!r}: Redis at {self.address} did not answer in time, so the "
                f"call may or may not have run: {error}"
            )
        return QueueUnavailable(
            f"queue {self.name!r} cannot reach Redis at {self.address}: {error}"
        )

    @property
    def schedules(self) -> QueueSchedules:
        """The queue's recurring messages: list, add, change, pause, resume, remove (a
        ``delayqueue_django.Schedules``, which the schedules wing plugs in)."""
        return features.schedules_of(self)
