"""The flow gates' values as the engine carries them (issue #27): a queue's state as the
``flow`` script reads it, and the reservations of a sharded queue's budget.

A queue of one shard enforces its gates inside its fetch (fetch.lua's flow_gate): no round
trip of their own. A sharded queue keeps one budget for the whole queue on shard 0, whose
keys belong to every layout (so a reshard, two layouts drained side by side, cannot double
it), judged by shard 0's clock; its shards hold no share of it and enforce neither gate.
A sharded fetch that has shards due first reserves up to its count from shard 0
(flow_reserve.lua): the sliding window's room under the rate limit, logged at once, and
free slots under the cap, held at once; then asks the shards for at most what it was
granted (GATES_RESERVED), and settles the reservation (flow_settle.lua): the hand-outs not
used go back to the window, and the slots become the deliveries'. What was asked of a shard
that failed is not given back (its reply may have been lost after it handed them out), and
what a shard repeating a lost request hands out beyond the grant is logged and holds slots:
counted twice at worst, never not at all. A repeated request reserves nothing and asks for
nothing new (only the shards' records are handed out again). A fetch granted nothing asks
one shard, in turn, for nothing: its housekeeping keeps up while the gates stay shut.
Under the cap, acks, refusals, releases and deletes in flight free their slots, and lease
extensions extend them (flow_slots.lua), one call to shard 0 per batch; a slot whose lease
ran out frees itself, so a killed worker's come back when its leases run out.

The cost, in round trips: a plain sharded queue none. Under a rate limit, one more per
fetch (the reservation) and one more when the shards handed out other than it granted (the
give-back). Under a cap, one more per fetch and one to settle every reservation, and one
more per ack, nack, release, lease extension batch and delete in flight. A fetch held back
asks one shard.

A sharded queue's pause and a rate set at run time live in shard 0's flow hash, where the
reservations read them, and every other shard holds a copy (engine.sharding.flow, which keeps
the copies in step across a reshard): a paused shard hands out nothing, whatever the
mode, and a fetch of a shard without a reservation (GATES_SHARD) that finds the queue's
rate ("queue_rate") takes nothing and says so (``FetchResult.unreserved``), and the
sharded store reserves from then on, until a reservation finds no rate in force.

On one shard the cap counts the unack zset; on several, the slots: deliveries handed out
before a queue goes from one to several shards (or back) do not count against the cap
after it until their leases run out. The rate's log is the same for both.
"""

from dataclasses import dataclass

# fetch.lua's flow gates' mode (ARGV[8]): a queue of one shard enforces its gates itself;
# a shard of a sharded queue is asked within a reservation, or without one (see above).
GATES_OWN = ""
GATES_RESERVED = "reserved"
GATES_SHARD = "shard"


@dataclass(frozen=True, slots=True)
class FlowState:
    """A queue's flow state as kept in Redis."""

    paused: bool
    # A rate limit set at run time, overriding the setting: (limit, period_ms), or None.
    rate: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Reservation:
    """What flow_reserve.lua granted a sharded fetch from the whole queue's budget."""

    # Shard 0's clock (ms) when it granted them.
    now_ms: int
    granted: int
    # When a fetch held back by the gates should look again (shard 0's clock), or None.
    again_ms: int | None
    # The rate in force (the run-time one, else the setting's), or None.
    rate: tuple[int, int] | None
    # When (time.monotonic()) shard 0's clock was read, as best this process can tell,
    # and how far that may be off (s), as in FetchResult.
    read_at: float = 0.0
    read_within: float = 0.0
    # The cap cut the grant (below what the rate allowed): see FetchResult.capped.
    capped: bool = False


def rate_wire(rate: tuple[int, int] | None) -> str:
    """A rate as fetch.lua and flow.lua take it: "<limit>:<period ms>", "" for none."""
    return "" if rate is None else f"{rate[0]}:{rate[1]}"


def parse_rate_wire(text: str) -> tuple[int, int] | None:
    limit, _, period = text.partition(":")
    if not (limit.isdigit() and period.isdigit()):
        return None
    return int(limit), int(period)
