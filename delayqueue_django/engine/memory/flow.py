"""The flow gates of a memory queue, as fetch.lua's flow_gate and flow.lua do them: pause,
the rate limit's sliding window of hand-outs, and the cap on deliveries in flight; and a
sharded queue's budget on shard 0, as flow_reserve.lua, flow_settle.lua and flow_slots.lua
keep it (see engine.flow)."""

import time
from collections.abc import Sequence

from delayqueue_django.engine.flow import GATES_RESERVED, GATES_SHARD, FlowState, Reservation
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.server import QueueState
from delayqueue_django.engine.records import StoreLimits

# A paused or capped fetch looks again within this long (ms), as in flow_gate.
LOOK_AGAIN_MS = 1000


def window_room(
    state: QueueState, count: int, now: int, rate: tuple[int, int]
) -> tuple[int, int | None]:
    """How many of ``count`` hand-outs the sliding window has room for, and when to look
    again if fewer (window_room in the prelude)."""
    limit, period = rate
    window = state.handed_out
    while window and window[0][0] <= now - period:
        window.popleft()
    used = len(window)
    if used >= limit:
        return 0, window[used - limit][0] + period
    if limit - used < count:
        return limit - used, (window[0][0] if window else now) + period
    return count, None


def gate(
    state: QueueState, limits: StoreLimits, count: int, now: int, gates: str
) -> tuple[int, int | None, bool, bool]:
    """How many of ``count`` a fetch may hand out, when to look again if the gates held
    work back (None when they did not), whether the fetch needs a reservation, and whether
    the cap cut the allowance (flow_gate's ``capped``)."""
    if state.paused:
        return 0, now + LOOK_AGAIN_MS, False, False
    if gates == GATES_RESERVED:
        return count, None, False, False
    if gates == GATES_SHARD:
        if state.queue_rate is not None:
            return 0, now, True, False
        return count, None, False, False
    allowance, again, capped = count, None, False
    rate = state.rate or limits.rate_limit
    if rate is not None:
        allowance, again = window_room(state, count, now, rate)
    if limits.max_in_flight:
        in_flight = len(state.unack) - len(state.unack.upto(now, len(state.unack)))
        room = max(limits.max_in_flight - in_flight, 0)
        if room < allowance:
            allowance, capped = room, True
            again = min(again or now + LOOK_AGAIN_MS, now + LOOK_AGAIN_MS)
    return allowance, again, False, capped


def record(state: QueueState, limits: StoreLimits, handed: int, now: int, gates: str) -> None:
    """Log ``handed`` hand-outs at ``now`` in the rate limit's window (a fetch of one shard;
    a sharded queue's are logged by its reservations)."""
    if gates not in (GATES_RESERVED, GATES_SHARD) and (state.rate or limits.rate_limit):
        state.handed_out.extend([(now, "")] * handed)


def _relog(state: QueueState, dropped: set[str], added: list[tuple[int, str]]) -> None:
    """The rate window without the entries named in ``dropped``, then with ``added``
    (``(time, name)``): ZREM, then ZADD."""
    kept = [entry for entry in state.handed_out if entry[1] not in dropped]
    state.handed_out.clear()
    state.handed_out.extend(kept + added)


class MemoryFlow(MemoryStoreBase):
    """Reading and changing the flow state (flow.lua), and a sharded queue's budget."""

    def flow(self, action: str = "read", rate: tuple[int, int] | None = None) -> FlowState:
        with self.server.lock:
            state = self._state()
            if action == "pause":
                state.paused = True
            elif action == "resume":
                if state.paused:
                    state.paused = False
                    self._wake(self._now())
            elif action == "rate":
                state.rate = state.queue_rate = rate
                self._wake(self._now())
            return FlowState(state.paused, state.queue_rate)

    def copy_flow(self, flow: FlowState) -> None:
        with self.server.lock:
            state = self._state()
            lifted = state.paused and not flow.paused
            changed = state.queue_rate != flow.rate
            state.paused, state.queue_rate = flow.paused, flow.rate
            if lifted or changed:
                self._wake(self._now())

    def reserve(self, count: int, name: str) -> Reservation:
        with self.server.lock:
            state, now = self._state(), self._now()
            limits = self._limits
            rate = state.rate or limits.rate_limit
            read_at = time.monotonic()
            if state.paused:
                return Reservation(now, 0, now + LOOK_AGAIN_MS, rate, read_at=read_at)
            granted, again, capped = count, None, False
            if rate is not None:
                granted, again = window_room(state, count, now, rate)
            if limits.max_in_flight:
                state.flow_slots.pop_upto(now, len(state.flow_slots))
                room = max(limits.max_in_flight - len(state.flow_slots), 0)
                if room < granted:
                    granted, capped = room, True
                    again = min(again or now + LOOK_AGAIN_MS, now + LOOK_AGAIN_MS)
            entries = [f"{name}:{n}" for n in range(1, granted + 1)]
            if rate is not None:
                # (A repeated name replaces its entries, as ZADD does.)
                _relog(state, set(entries), [(now, entry) for entry in entries])
            if limits.max_in_flight:
                for entry in entries:
                    state.flow_slots.add(entry, now + limits.consume_ms)
            return Reservation(now, granted, again, rate, read_at=read_at, capped=capped)

    def settle(
        self, name: str, reserved: int, used: int, ids: Sequence[str], beyond: int = 0
    ) -> None:
        with self.server.lock:
            state, now = self._state(), self._now()
            unused = {f"{name}:{n}" for n in range(used + 1, reserved + 1)}
            # (Named past the reservation's; a repeated name replaces its entries, as ZADD.)
            logged = {f"{name}:{reserved + n}" for n in range(1, beyond + 1)}
            rate = state.rate or self._limits.rate_limit
            if unused or (logged and rate is not None):
                added = [(now, entry) for entry in sorted(logged)] if rate is not None else []
                _relog(state, unused | logged, added)
            # The slots of the first len(ids) entries go to the deliveries; those of the
            # rest of the used ones (a lost reply's part) stay.
            for n in [*range(1, min(len(ids), used) + 1), *range(used + 1, reserved + 1)]:
                state.flow_slots.remove(f"{name}:{n}")
            for message_id in ids:
                state.flow_slots.add(message_id, now + self._limits.consume_ms)

    def free_slots(self, ids: Sequence[str]) -> int:
        with self.server.lock:
            state = self._state()
            return sum(state.flow_slots.remove(message_id) for message_id in ids)

    def extend_slots(self, ids: Sequence[str]) -> int:
        with self.server.lock:
            state, now = self._state(), self._now()
            held = [message_id for message_id in ids if message_id in state.flow_slots]
            for message_id in held:
                state.flow_slots.add(message_id, now + self._limits.consume_ms)
            return len(held)
