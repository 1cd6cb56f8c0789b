"""A sharded queue's flow state over its shards (issue #27). Shard 0's is the queue's, and
each other shard keeps a copy that its fetches check: a pause holds them, and a rate set at
run time tells a process that had not heard of it to reserve (see engine.flow). So a sharded
fetch without a gate still makes no round trip to shard 0.

Two paths write the copies:

- A pause, resume or rate (``ShardedStore.flow``) changes shard 0 first. Then it reads the
  register of layouts again and copies shard 0's state to every shard of every layout on
  it (draining ones and ones just added) and to this store's own shards.
- A layout's registration (engine.sharding.layouts, before its shards are first written)
  reads shard 0's state in the same call as its SADD and copies it to the layout's
  shards.

A change another process makes meanwhile reaches the new shards either way. If it reached
shard 0 before the SADD, the registration reads it; if after, it finds the layout on the
register. What remains is a stale copy landing late, over a newer one: a registration's
copy after a pause that came between its read and its write, or a pause's copy after a
resume that came between the pause and the copy. So each path reads shard 0 again after
its copies, and copies again until what it copied is still shard 0's state. Its last copy
is then no older than the last change, and the process that made that change copies it
after. A path loops only while shard 0 keeps changing under it.

A registration copies only when the layout is new on the register, or when shard 0's
state is not the default (not paused, no rate set at run time). A layout already on the
register got every change since from the first path. Copying the default mends a layout
that was registered while the queue was paused, retired, and registered again after a
resume: its shards kept the pause, since a resume writes only the layouts on the
register.
"""

from collections.abc import Callable, Mapping

from redis.exceptions import RedisError

from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.protocol import ShardStore

# A queue never paused and without a rate set at run time (or back to that).
NO_FLOW = FlowState(paused=False, rate=None)


def spread(
    base: ShardStore,
    state: FlowState,
    shards: Callable[[], Mapping[str, ShardStore]],
    unreached: dict[str, Exception] | None = None,
) -> FlowState:
    """Copy ``state``, shard 0's (``base``) as last read, to ``shards()`` (by name, listed
    again each round), and again for as long as shard 0's changed meanwhile (see above);
    returns the state last copied. With ``unreached``, a shard whose copy fails (its
    Redis) is noted there with the error and left out from then on, so that one master
    down holds up no copy to the others; without, the error is raised."""
    while copies := {
        name: store for name, store in shards().items() if name not in (unreached or {})
    }:
        for name, store in copies.items():
            try:
                store.copy_flow(state)
            except (RedisError, OSError) as error:
                if unreached is None:
                    raise
                unreached[name] = error
        now = base.flow()
        if now == state:
            return state
        state = now
    return state
