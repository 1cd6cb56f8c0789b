"""``MemoryStore``: one queue's whole life cycle in this process, with the semantics of the
Lua scripts.

Each method is the script of the same name (``engine/lua/*.lua``, whose headers document
the semantics) done in Python under the server's lock: the same states, leases, attempts and
budgets, due times handed out with deliveries, nack delays and burials, timeouts, releases,
the exhaustion announcements and their claims, the staging bounds, the throughput counts and
running totals, and the wake-ups; heartbeats and task results expire on its clock as Redis
keys do on Redis's. Nothing else can write to its structures, so the scripts' damage
handling (missing payloads or meta records, keys of the wrong type) has no counterpart here.

For tests and quick local runs: its messages live and die with the process and are invisible
to other processes.
"""

from delayqueue_django.engine.memory.bookkeeping import MemoryBookkeeping
from delayqueue_django.engine.memory.delivery import MemoryDelivery
from delayqueue_django.engine.memory.flow import MemoryFlow
from delayqueue_django.engine.memory.keyed import MemoryKeyed
from delayqueue_django.engine.memory.operators import MemoryOperators
from delayqueue_django.engine.memory.relay import MemoryRelay
from delayqueue_django.engine.memory.schedules import MemorySchedules


class MemoryStore(
    MemoryDelivery,
    # The relay before the keyed messages it builds on (it decides keyed rows as they do).
    MemoryRelay,
    MemoryKeyed,
    MemoryOperators,
    MemorySchedules,
    MemoryBookkeeping,
    MemoryFlow,
):
    """One queue on a memory server: each part mirrors a family of the Lua scripts (the
    delivery of messages, keyed messages, the relay, operators' reads and moves, schedules,
    and what is kept beside the messages, and the flow gates)."""
