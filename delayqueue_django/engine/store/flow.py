"""A ``RedisStore``'s flow gates: the pause and the rate (flow.lua), and a sharded queue's
budget on shard 0 (reservations and the cap's slots; see engine.flow)."""

import time
from collections.abc import Sequence

from delayqueue_django.engine.flow import FlowState, Reservation, parse_rate_wire, rate_wire
from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.replies import _flow_state, _text


class RedisFlow(RedisStoreBase):
    """The flow state and the budget."""

    def flow(self, action: str = "read", rate: tuple[int, int] | None = None) -> FlowState:
        """Read the flow state, or change it first: "pause", "resume", or "rate" (set
        ``rate``, or None to go back to the setting's); see flow.lua."""
        paused, rate_text, _ = self._run("flow", [self._channel, action, rate_wire(rate)])
        return _flow_state(paused, rate_text)

    def copy_flow(self, state: FlowState) -> None:
        """Take shard 0's flow state (a shard of a sharded queue but shard 0; see
        engine.sharding.flow)."""
        self._run("flow", [self._channel, "copy", rate_wire(state.rate), int(state.paused)])

    def reserve(self, count: int, name: str) -> Reservation:
        """Reserve up to ``count`` hand-outs from a sharded queue's budget, on shard 0,
        as entries named after ``name`` (see flow_reserve.lua)."""
        limits = self.limits
        sent_at = time.monotonic()
        now, granted, again, rate_text, capped, _ = self._run(
            "flow_reserve",
            [count, name, rate_wire(limits.rate_limit), limits.max_in_flight, limits.consume_ms],
        )
        received_at = time.monotonic()
        return Reservation(
            int(now),
            int(granted),
            None if int(again) < 0 else int(again),
            parse_rate_wire(_text(rate_text)),
            read_at=(sent_at + received_at) / 2,
            read_within=(received_at - sent_at) / 2,
            capped=bool(capped),
        )

    def settle(
        self, name: str, reserved: int, used: int, ids: Sequence[str], beyond: int = 0
    ) -> None:
        """Give back what a reservation did not use, log what went out beyond it, and
        hold the slots of ``ids``, the deliveries handed out under a cap (see
        flow_settle.lua)."""
        limits = self.limits
        self._run(
            "flow_settle",
            [
                *(name, reserved, used, limits.consume_ms, rate_wire(limits.rate_limit)),
                *(beyond, len(ids), *map(wire, ids)),
            ],
        )

    def free_slots(self, ids: Sequence[str]) -> int:
        """Free the cap's slots of these deliveries (see flow_slots.lua)."""
        return self._slots("free", ids)

    def extend_slots(self, ids: Sequence[str]) -> int:
        """Hold the cap's slots of these deliveries until now + consume_ms."""
        return self._slots("extend", ids)

    def _slots(self, action: str, ids: Sequence[str]) -> int:
        changed, _ = self._run(
            "flow_slots", [action, self.limits.consume_ms, len(ids), *map(wire, ids)]
        )
        return int(changed)
