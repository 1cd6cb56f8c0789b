"""The queue's life cycle in this process's memory, with the semantics of the Lua scripts:
for users' tests and quick local runs (``"URL": "memory://"``), never production."""

from delayqueue_django.engine.memory.clock import Clock, ManualClock, SystemClock
from delayqueue_django.engine.memory.server import (
    MemoryServer,
    SentRecord,
    add_server,
    flush_servers,
    get_server,
    remove_server,
)
from delayqueue_django.engine.memory.store import MemoryStore

__all__ = [
    "Clock",
    "ManualClock",
    "MemoryServer",
    "MemoryStore",
    "SentRecord",
    "SystemClock",
    "add_server",
    "flush_servers",
    "get_server",
    "remove_server",
]
