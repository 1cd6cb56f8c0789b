"""What a ``ShardedStore``'s fetch plan learns of each shard (see engine.sharding.fetch):
when it next has work, from its fetches and from the wake-ups a subscription hears, and
whether its Redis failed. Apart from the fetch, which reads the plan to choose the shards
it asks."""

import logging
import math
import time
from collections.abc import Iterable

from delayqueue_django.engine.protocol import ChannelSubscription
from delayqueue_django.engine.records import FetchResult
from delayqueue_django.engine.sharding.layouts import SHARD_RETRY_SECONDS, ShardLayouts
from delayqueue_django.engine.sharding.plan import ShardPlan

logger = logging.getLogger("delayqueue_django.engine")


class ShardPlanning(ShardLayouts):
    """Keeping the plan: each shard's next due time, failures and wake-ups."""

    def _failing(self, name: str) -> bool:
        with self._lock:
            plan = self._plans.get(name)
            return plan is not None and plan.failing_since is not None

    def _failed(self, name: str, plan: ShardPlan, error: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            plan.retry_at = now + SHARD_RETRY_SECONDS
            first = plan.failing_since is None
            if first:
                plan.failing_since = now
        if first:
            logger.warning(
                "queue %s: shard %s cannot be reached (%s); its messages wait, the other "
                "shards go on; trying it every %g s",
                self.keys.queue,
                name,
                error,
                SHARD_RETRY_SECONDS,
            )

    def _learn(self, name: str, plan: ShardPlan, result: FetchResult) -> None:
        if result.next_ms is None:
            due_ms = math.inf
        elif result.next_ms <= result.now_ms:
            due_ms = -math.inf
        else:
            due_ms = result.next_ms
        with self._lock:
            plan.fetched = True
            plan.due_ms = min(due_ms, plan.heard_ms)
            plan.owed = result.exhaustions_owed
            plan.retry_at = -math.inf
            failing_since, plan.failing_since = plan.failing_since, None
        if failing_since is not None:
            logger.warning(
                "queue %s: shard %s reached again after %.1f s",
                self.keys.queue,
                name,
                time.monotonic() - failing_since,
            )

    def _local_due(self, name: str) -> float:
        """When shard ``name`` next has work, on the monotonic clock (s); lock held."""
        plan = self._plans[name]
        if plan.due_ms in (-math.inf, math.inf):
            local = plan.due_ms
        elif self._reference_ms is None:
            local = -math.inf
        else:
            local = (plan.due_ms - self._reference_ms) / 1000
        return max(local, plan.retry_at)

    def listening(self, change: int) -> None:
        """A wake-up subscription of this store began (+1) or ended (-1) listening."""
        with self._lock:
            self._listening += change

    def heard(self, name: str, due_ms: int) -> None:
        """A wake-up from shard ``name``, due at ``due_ms``: the plan learns it."""
        with self._lock:
            plan = self._plans.get(name)
            if plan is not None:
                plan.heard_ms = min(plan.heard_ms, due_ms)
                plan.due_ms = min(plan.due_ms, due_ms)

    def _look_again(self, names: Iterable[str]) -> None:
        """Work may have come due on these shards (a retry, a hand-back, a requeue)."""
        with self._lock:
            for name in names:
                plan = self._plans.get(name)
                if plan is not None:
                    plan.due_ms = -math.inf

    def _subscribe(self) -> tuple[int, ChannelSubscription, dict[str, str]]:
        """A subscription to the wake-ups of every shard fetched from, and the generation
        of that list of shards."""
        self.refresh_layouts()
        with self._lock:
            generation, names = self.generation, list(self._order)
        channels = {self._store(name).keys.wakeup_channel: name for name in names}
        subscription = self.base.subscribe_channels(list(channels))
        # A layout announced before the subscription took effect was heard by no one (at a
        # worker's start, its own relay writing rows another layout placed): read the
        # register now. If it changed, the generation returned is behind, and the
        # subscription follows the new list at once.
        self.refresh_layouts(due=True)
        return generation, subscription, channels
