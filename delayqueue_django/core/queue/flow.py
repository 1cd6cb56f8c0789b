"""``Queue``'s flow gates (docs/guides/flow-control.md): pausing and resuming the queue,
and the rate limit set at run time. RATE_LIMIT and MAX_IN_FLIGHT themselves are settings,
which every worker's fetch enforces (see fetch.lua)."""

from dataclasses import dataclass

from asgiref.sync import sync_to_async

from delayqueue_django.core.conf.flow import parse_rate, rate_problem, shown_rate
from delayqueue_django.core.queue.base import QueueBase, _areaching_redis, _reaching_redis


@dataclass(frozen=True)
class Flow:
    """A queue's flow gates as they stand."""

    paused: bool
    # The rate limit in force ("10/s"), "" for none; and whether it was set at run time
    # (set_rate_limit), overriding the RATE_LIMIT setting.
    rate_limit: str
    rate_limit_overridden: bool
    # MAX_IN_FLIGHT, 0 for no cap.
    max_in_flight: int


class QueueFlow(QueueBase):
    """Pause, resume, and the run-time rate limit, kept in Redis for every worker."""

    @_reaching_redis
    def pause(self) -> None:
        """Stop handing out this queue's messages, on every worker, until ``resume``: the
        deliveries in flight finish and are acked, sends, schedules and retries keep
        arriving. Kept in Redis, so it outlives workers' and Redis's restarts."""
        self.store.flow("pause")

    @_reaching_redis
    def resume(self) -> None:
        """Hand messages out again; idle workers are woken at once."""
        self.store.flow("resume")

    @_reaching_redis
    def set_rate_limit(self, rate: str | None) -> None:
        """Set the rate limit ("20/s", "600/m", "5000/h") in Redis for every worker,
        overriding the RATE_LIMIT setting; None goes back to the setting's. Raises
        ValueError for a malformed rate, writing nothing."""
        parsed = None if rate is None else parse_rate(rate)
        if rate is not None and parsed is None:
            raise ValueError(rate_problem("The rate limit", rate))
        self.store.flow("rate", parsed)

    @_reaching_redis
    def flow(self) -> Flow:
        """The queue's flow gates: paused, the rate limit in force, the cap."""
        state = self.store.flow()
        rate = state.rate or self.config.rate_limit
        return Flow(
            paused=state.paused,
            rate_limit=shown_rate(rate),
            rate_limit_overridden=state.rate is not None,
            max_in_flight=self.config.max_in_flight,
        )

    @_areaching_redis
    async def apause(self) -> None:
        """``pause`` for async code."""
        await sync_to_async(self.pause, thread_sensitive=False)()

    @_areaching_redis
    async def aresume(self) -> None:
        """``resume`` for async code."""
        await sync_to_async(self.resume, thread_sensitive=False)()
