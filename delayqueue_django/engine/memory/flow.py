"""The flow gates of a memory queue, as fetch.lua's flow_gate and flow.lua do them: pause,
the rate limit's sliding window of hand-outs, and the cap on deliveries in flight."""

from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.memory.server import QueueState
from delayqueue_django.engine.records import StoreLimits

# A paused or capped fetch looks again within this long (ms), as in flow_gate.
LOOK_AGAIN_MS = 1000


def gate(state: QueueState, limits: StoreLimits, count: int, now: int) -> tuple[int, int | None]:
    """How many of ``count`` a fetch may hand out, and when to look again if the gates
    held work back (None when they did not)."""
    if state.paused:
        return 0, now + LOOK_AGAIN_MS
    allowance, again = count, None
    rate = state.rate or limits.rate_limit
    if rate is not None:
        limit, period = rate
        window = state.handed_out
        while window and window[0] <= now - period:
            window.popleft()
        used = len(window)
        if used >= limit:
            allowance, again = 0, window[used - limit] + period
        elif limit - used < allowance:
            allowance = limit - used
            again = (window[0] if window else now) + period
    if limits.max_in_flight:
        in_flight = len(state.unack) - len(state.unack.upto(now, len(state.unack)))
        room = max(limits.max_in_flight - in_flight, 0)
        if room < allowance:
            allowance = room
            again = min(again or now + LOOK_AGAIN_MS, now + LOOK_AGAIN_MS)
    return allowance, again


def record(state: QueueState, limits: StoreLimits, handed: int, now: int) -> None:
    """Log ``handed`` hand-outs at ``now`` in the rate limit's window."""
    if state.rate or limits.rate_limit:
        state.handed_out.extend([now] * handed)


class MemoryFlow(MemoryStoreBase):
    """Reading and changing the flow state (flow.lua)."""

    def flow(
        self,
        action: str = "read",
        rate: tuple[int, int] | None = None,
        *,
        share: tuple[int, int] | None = None,
    ) -> FlowState:
        with self.server.lock:
            state = self._state()
            if action == "pause":
                state.paused = True
            elif action == "resume":
                if state.paused:
                    state.paused = False
                    self._wake(self._now())
            elif action == "rate":
                state.rate = rate if share is None else share
                state.queue_rate = rate
                self._wake(self._now())
            return FlowState(state.paused, state.queue_rate)
