"""The servers of a ``ShardedStore`` that hung, as its fetches meet them: their shards held
out of fetches (engine.sharding.hangs keeps the record) and probed until one answers.
Apart from the fetch, which asks only the shards not held."""

import logging
import math
import time
from functools import partial

from delayqueue_django.engine.sharding.hangs import (
    FETCH_PATIENCE_SECONDS,
    Hang,
    start_probe,
    wait_for_probes,
)
from delayqueue_django.engine.sharding.layouts import ShardLayouts

logger = logging.getLogger("delayqueue_django.engine")


class ShardHolding(ShardLayouts):
    """Holding a hung server's shards out of fetches, and probing it."""

    def on_same_server(self, name: str) -> list[str]:
        """The other shards fetched from whose keys are on shard ``name``'s server, as the
        client last learned it (no round trip): a server that hangs hangs them all."""
        server = self._store(name).server_name()
        with self._lock:
            order = list(self._order)
        return [
            other for other in order if other != name and self._store(other).server_name() == server
        ]

    def hold_siblings(self, name: str) -> list[str]:
        """Shard ``name``'s server did not answer in time: it is held as hung, its shards
        (the other shards on it too) not asked until a probe of it answers (each would
        wait out its own timeout, the other servers' shards held up meanwhile: a queue of
        12 shards on one server, 12 socket timeouts). Returns the others."""
        siblings = self.on_same_server(name)
        server = self._store(name).server_name()
        now = time.monotonic()
        with self._lock:
            new = server not in self._hung.hangs
            hang = self._hung.hold(server, {name, *siblings}, now)
            self._hold_plans(hang)
        if new:
            logger.warning(
                "queue %s: server %s did not answer in time; its shards (%s) are left out "
                "of fetches until it answers a probe",
                self.keys.queue,
                server,
                ", ".join(sorted(hang.shards)),
            )
        return siblings

    def _hold_plans(self, hang: Hang) -> None:
        """The plans of a hung server's shards: held, looked at again at its next probe
        (the consumer wakes then: it may have answered); lock held."""
        for shard in hang.shards:
            plan = self._plans.get(shard)
            if plan is not None:
                plan.held = True
                plan.retry_at = hang.probe_at

    def _probe_hung(self, now: float) -> None:
        """Start a probe of each hung server whose backoff is over (none on a healthy
        queue: an empty dict looked at). With every shard held, the fetch has nothing
        else to ask: it waits for them, FETCH_PATIENCE_SECONDS at the most."""
        if not self._hung.hangs:
            return
        with self._lock:
            due, passed = self._hung.due(now)
            for hang in passed:
                self._hold_plans(hang)
        probes = [
            start_probe(
                server,
                partial(self._store(min(hang.shards)).fetch, 0),
                partial(self._probed, server),
            )
            for server, hang in due
        ]
        with self._lock:
            every_shard_held = all(self._plans[name].held for name in self._order)
        if probes and every_shard_held:
            wait_for_probes(probes, FETCH_PATIENCE_SECONDS)

    def _probed(self, server: str, answered: bool) -> None:
        """A probe's outcome: an answer ends the hold, its shards looked at at once."""
        with self._lock:
            hang = self._hung.hangs.get(server)
            if hang is None:
                return
            if not answered:
                hang.probe_failed(time.monotonic())
                self._hold_plans(hang)
                return
            del self._hung.hangs[server]
            for shard in hang.shards:
                plan = self._plans.get(shard)
                if plan is not None:
                    plan.held = False
                    plan.retry_at = -math.inf
                    plan.due_ms = -math.inf
        logger.warning(
            "queue %s: server %s answers again after %.1f s; its shards are fetched from again",
            self.keys.queue,
            server,
            time.monotonic() - hang.since,
        )
