"""Loading the Lua scripts shipped in ``lua/``.

Each script is the shared ``_prelude.lua`` followed by the script's own file. Scripts are
registered with redis-py, which calls them by SHA (EVALSHA) and reloads them after a
server restart (NOSCRIPT).
"""

from functools import cache
from importlib import resources
from typing import Any

SCRIPT_NAMES = (
    "ack",
    "add_totals",
    "claim_exhausted",
    "drop_garbage",
    "extend",
    "fetch",
    "list",
    "nack",
    "peek",
    "promote",
    "prune_throughput",
    "release",
    "remove",
    "requeue",
    "send",
    "snapshot",
    "stats",
    "throughput",
    "totals",
)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def source(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return _read("_prelude") + "\n" + _read(name)


class Scripts:
    """The queue's scripts registered on one Redis client: sync or asyncio, plain or cluster
    (calling one returns the reply, or an awaitable of it on an asyncio client)."""

    def __init__(self, client: object) -> None:
        register = client.register_script  # type: ignore[attr-defined]
        self._by_name: dict[str, Any] = {name: register(source(name)) for name in SCRIPT_NAMES}

    def __getitem__(self, name: str) -> Any:
        return self._by_name[name]
