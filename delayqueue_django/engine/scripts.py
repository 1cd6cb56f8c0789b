"""The queue's Lua (``lua/``) as one Redis Functions library, and the clients that call it.

``_prelude.lua`` followed by every script's file, each as the body of a function taking
``(keys, args)``, make one library (``FUNCTION LOAD``): the prelude runs once when the
library is loaded, not on every call. The read-only functions are flagged ``no-writes``
and called with ``FCALL_RO``; those that free memory or only move messages are flagged
``allow-oom``, so that a Redis over its ``maxmemory`` still lets workers drain it while it
refuses new messages.

The library's name, and every function's, carries a hash of the library's text, so two
releases of the app (a rolling deploy) each call their own functions on one Redis.

It is loaded when a call finds it missing (a new server, a restart without persistence,
``FUNCTION FLUSH``, a cluster node that never had it) and the call is made again. A server
that refuses ``FUNCTION LOAD`` (some managed services do) is served the same text as one
``EVALSHA`` script per function instead: the prelude and that function, called at once.
"""

import hashlib
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    ResponseError,
    TimeoutError,
)

logger = logging.getLogger("delayqueue_django.engine")

SCRIPT_NAMES = (
    "ack",
    "add_layout",
    "add_totals",
    "claim_exhausted",
    "confirm_exhausted",
    "drop_garbage",
    "ended",
    "extend",
    "fetch",
    "flow",
    "flow_reserve",
    "flow_settle",
    "flow_slots",
    "holds_key",
    "list",
    "lookup",
    "metrics",
    "nack",
    "peek",
    "promote",
    "prune_throughput",
    "relay",
    "release",
    "remove",
    "requeue",
    "reschedule",
    "schedule",
    "schedules",
    "send",
    "send_keyed",
    "snapshot",
    "stats",
    "totals",
)

# Called with FCALL_RO: they run on a Redis out of memory and could run on a replica.
READ_ONLY = frozenset(
    {
        "ended",
        "holds_key",
        "list",
        "lookup",
        "metrics",
        "peek",
        "schedules",
        "snapshot",
        "stats",
        "totals",
    }
)

# Flagged allow-oom: Redis runs them while it is over maxmemory (with noeviction), as they
# free memory or only move what is there, so workers drain a full Redis. Redis refuses the
# others whole at such a time (send and relay, and the steps that add: extend, claims,
# requeue, deliver-now, schedules, totals), as it refused them on their first write when
# they were scripts.
ALLOWED_OUT_OF_MEMORY = frozenset(
    {"ack", "confirm_exhausted", "drop_garbage", "fetch", "nack", "prune_throughput"}
    | {"release", "remove"}
    # A sharded queue's budget (flow_reserve.lua): its fetches drain a full Redis too.
    | {"flow_reserve", "flow_settle", "flow_slots"}
)

# A call that finds the library missing loads it and tries again; on a cluster whose layout
# changes meanwhile, the next node asked may lack it too.
ATTEMPTS = 3


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _flags(name: str) -> str:
    if name in READ_ONLY:
        return "{'no-writes'}"
    if name in ALLOWED_OUT_OF_MEMORY:
        return "{'allow-oom'}"
    return "{}"


# Called with the layout's first key alone (KEYS[1], pending), the rest derived from it in
# the Lua (layout_of in _prelude.lua): a send per message carries one key, not ten (each
# argument costs redis-py some 0.2 µs to pack). Or with the whole layout, as on Redis
# Cluster (see send_keys): while a slot migrates, a node refuses a script that touches a
# key it did not declare, where declared keys get the redirection the client follows.
FIRST_KEY_ONLY = frozenset({"send"})


def send_keys(layout: list[str], *, cluster: bool) -> list[str]:
    """The keys a store gives the functions of FIRST_KEY_ONLY."""
    return list(layout) if cluster else layout[:1]


def _function(name: str) -> str:
    """A script's file as a function of (keys, args); its state set up by begin()."""
    keys = "#keys == 1 and layout_of(keys[1]) or keys" if name in FIRST_KEY_ONLY else "keys"
    return f"function(keys, args)\nbegin({keys})\n{_read(name)}\nend"


def _library(prefix: str) -> str:
    registrations = "\n".join(
        f"redis.register_function{{function_name='{prefix}_{name}', "
        f"callback={_function(name)}, flags={_flags(name)}}}"
        for name in SCRIPT_NAMES
    )
    return f"#!lua name={prefix}\n{_read('_prelude')}\n{registrations}\n"


@dataclass(frozen=True)
class Library:
    name: str
    code: str

    def function(self, script: str) -> str:
        return f"{self.name}_{script}"


@cache
def library() -> Library:
    """The library, named after a hash of its text (with its name left out)."""
    version = hashlib.sha1(_library("delayqueue").encode()).hexdigest()[:12]
    name = f"delayqueue_{version}"
    return Library(name, _library(name))


@cache
def source(name: str) -> str:
    """The script served by EVALSHA in place of the library's function ``name``."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return f"{_read('_prelude')}\nreturn ({_function(name)})(KEYS, ARGV)\n"


def _function_missing(error: ResponseError) -> bool:
    return "function not found" in str(error).lower()


def _refused_functions(error: ResponseError) -> bool:
    """FCALL itself refused: a server without Functions, or a user not allowed them."""
    text = str(error).lower()
    if isinstance(error, NoPermissionError):
        return "'fcall" in text
    return "unknown command" in text


def _note_scripts(error: ResponseError) -> None:
    logger.warning(
        "Redis refused the queue's Functions library (%s); its Lua runs as EVALSHA scripts", error
    )


def _command(name: str) -> str:
    return "FCALL_RO" if name in READ_ONLY else "FCALL"


class Lua:
    """The library called on one redis-py client (plain or cluster), or, where the server
    refuses it, the same Lua as EVALSHA scripts. Safe to share between threads."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.is_cluster = isinstance(client, RedisCluster)
        self._library = library()
        self._scripts: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @property
    def uses_scripts(self) -> bool:
        return self._scripts is not None

    def __call__(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], attempt: int = 1
    ) -> Any:
        """Function ``name`` on ``keys`` with ``args``; ``attempt``: of ATTEMPTS, for a
        call made again (see bound)."""
        while True:
            if self._scripts is not None:
                return self._scripts[name](keys=keys, args=args)
            try:
                return self._fcall(name, keys, args)
            except ResponseError as error:
                if attempt == ATTEMPTS or not self._recover(error, keys[0]):
                    raise
            attempt += 1

    def bound(self, name: str, keys: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
        """A call of function ``name`` on ``keys`` whose command head (FCALL, the function's
        name, the keys' count and the keys) is built once: a caller making a call per
        message (a send) builds only its arguments. The same call as ``self(name, keys,
        args)``: on a cluster, or once the Lua runs as scripts, it is that call, and a
        refusal the library's load or the scripts answer is made again by it."""
        head = (_command(name), self._library.function(name), len(keys), *keys)
        keys = list(keys)

        def call(args: Sequence[Any]) -> Any:
            if self._scripts is not None or self.is_cluster:
                return self(name, keys, args)
            try:
                return self.client.execute_command(*head, *args)
            except ResponseError as error:
                if not self._recover(error, keys[0]):
                    raise
            return self(name, keys, args, attempt=2)

        return call

    def _recover(self, error: ResponseError, key: Any) -> bool:
        """Whether a call refused with ``error`` may be made again, now that the library was
        loaded or its scripts are used instead."""
        if _refused_functions(error):
            self._use_scripts(error)
        elif _function_missing(error):
            self._load(key)
        else:
            return False
        return True

    def pipelined(
        self, name: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """Several calls of one function in one round trip (plain Redis only). Made again as
        a whole when the library was missing: missing for one call, it was for every call
        (they ran on one server; and send and relay, their users, are safe to repeat)."""
        attempt = 1
        while True:
            scripts = self._scripts
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                if scripts is not None:
                    scripts[name](keys=keys, args=args, client=pipe)
                else:
                    function = self._library.function(name)
                    pipe.execute_command(_command(name), function, len(keys), *keys, *args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            errors = [reply for reply in replies if isinstance(reply, Exception)]
            if not errors:
                return replies
            first = errors[0]
            if not (
                scripts is None
                and attempt < ATTEMPTS
                and isinstance(first, ResponseError)
                and self._recover(first, calls[0][0][0])
            ):
                raise first
            attempt += 1

    def _fcall(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        command, function = _command(name), self._library.function(name)
        if not self.is_cluster:
            return self.client.execute_command(command, function, len(keys), *keys, *args)
        # redis-py asks a cluster node for the keys of every FCALL (COMMAND GETKEYS, a round
        # trip of its own), as it cannot read them from the command; the keys share a slot,
        # so the call goes straight to the node serving it. Should that node fail, the call
        # goes the general way, which finds the cluster's new layout and retries.
        try:
            node = self.client.get_node_from_key(keys[0])
            return self.client.execute_command(
                command, function, len(keys), *keys, *args, target_nodes=node
            )
        except TimeoutError:
            # A node that does not answer in time (hung, paused, cut off), not one that is
            # gone: the general way would try it again some ten times, each a whole
            # timeout, holding up the caller, and a sharded queue's other shards with it.
            # The layout is learnt anew (a failover may have begun), and the caller told.
            self.client.nodes_manager.initialize()
            raise
        except (ConnectionError, ClusterDownError, RedisClusterException):
            # The node is gone (a failover, say): learn the cluster's layout anew first, as
            # redis-py would before its own retry; a call aimed at a node gets none.
            self.client.nodes_manager.initialize()
            return self.client.execute_command(command, function, len(keys), *keys, *args)

    def _load(self, key: Any) -> None:
        code = self._library.code
        try:
            if self.is_cluster:
                # On the node serving the queue's slot: it answered "function not found".
                node = self.client.get_node_from_key(key)
                self.client.execute_command("FUNCTION LOAD", "REPLACE", code, target_nodes=node)
            else:
                self.client.execute_command("FUNCTION LOAD", "REPLACE", code)
        except OutOfMemoryError:
            raise
        except ResponseError as error:
            self._use_scripts(error)

    def _use_scripts(self, error: ResponseError) -> None:
        with self._lock:
            if self._scripts is None:
                _note_scripts(error)
                register = self.client.register_script
                self._scripts = {name: register(source(name)) for name in SCRIPT_NAMES}


class AsyncLua:
    """Lua on a redis.asyncio client (plain or cluster): the same calls as Lua, awaited."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.is_cluster = isinstance(client, AsyncRedisCluster)
        self._library = library()
        self._scripts: dict[str, Any] | None = None

    @property
    def uses_scripts(self) -> bool:
        return self._scripts is not None

    async def __call__(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], attempt: int = 1
    ) -> Any:
        while True:
            if self._scripts is not None:
                return await self._scripts[name](keys=keys, args=args)
            try:
                return await self._fcall(name, keys, args)
            except ResponseError as error:
                if attempt == ATTEMPTS or not await self._recover(error, keys[0]):
                    raise
            attempt += 1

    def bound(
        self, name: str, keys: Sequence[Any]
    ) -> Callable[[Sequence[Any]], Coroutine[Any, Any, Any]]:
        """Lua.bound, awaited."""
        head = (_command(name), self._library.function(name), len(keys), *keys)
        keys = list(keys)

        async def call(args: Sequence[Any]) -> Any:
            if self._scripts is not None or self.is_cluster:
                return await self(name, keys, args)
            try:
                return await self.client.execute_command(*head, *args)
            except ResponseError as error:
                if not await self._recover(error, keys[0]):
                    raise
            return await self(name, keys, args, attempt=2)

        return call

    async def _recover(self, error: ResponseError, key: Any) -> bool:
        if _refused_functions(error):
            self._use_scripts(error)
        elif _function_missing(error):
            await self._load(key)
        else:
            return False
        return True

    async def _fcall(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        command, function = _command(name), self._library.function(name)
        if not self.is_cluster:
            return await self.client.execute_command(command, function, len(keys), *keys, *args)
        try:  # straight to the slot's node, as Lua._fcall does
            await self.client.initialize()
            node = self.client.get_node_from_key(keys[0])
            return await self.client.execute_command(
                command, function, len(keys), *keys, *args, target_nodes=node
            )
        except (ConnectionError, TimeoutError, ClusterDownError, RedisClusterException):
            return await self.client.execute_command(command, function, len(keys), *keys, *args)

    async def _load(self, key: Any) -> None:
        code = self._library.code
        try:
            if self.is_cluster:
                await self.client.initialize()
                node = self.client.get_node_from_key(key)
                await self.client.execute_command(
                    "FUNCTION LOAD", "REPLACE", code, target_nodes=node
                )
            else:
                await self.client.execute_command("FUNCTION LOAD", "REPLACE", code)
        except OutOfMemoryError:
            raise
        except ResponseError as error:
            self._use_scripts(error)

    def _use_scripts(self, error: ResponseError) -> None:
        if self._scripts is None:
            _note_scripts(error)
            register = self.client.register_script
            self._scripts = {name: register(source(name)) for name in SCRIPT_NAMES}
