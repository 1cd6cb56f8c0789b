"""A ``ShardedStore``'s claims of exhausted messages to announce: from the shards whose
last fetch said one is owed, in turn. Apart from the fetch: it reads what the fetches
learned, but asks the shards on a path of its own."""

from redis.exceptions import RedisError

from delayqueue_django.engine.records import ExhaustedClaim
from delayqueue_django.engine.sharding.layouts import ShardLayouts


class ShardClaims(ShardLayouts):
    """Claiming exhausted messages across shards."""

    def claim_exhausted(self, count: int, claim_ms: int) -> list[ExhaustedClaim]:
        """From the shards whose last fetch said one is owed, or never fetched (every
        shard, when none is), in turn, until ``count``. A shard that cannot be reached is
        passed over (its announcements wait for it); raises only if every one asked fails."""
        with self._lock:
            # (Not the shards of a hung server: each would wait out a socket timeout.)
            order = [name for name in self._order if not self._plans[name].held] or list(
                self._order
            )
            owed = [
                name for name in order if self._plans[name].owed or not self._plans[name].fetched
            ]
        claims: list[ExhaustedClaim] = []
        asked_shards = failed = 0
        for name in owed or order:
            if len(claims) >= count:
                break
            asked = count - len(claims)
            asked_shards += 1
            try:
                found = self._store(name).claim_exhausted(asked, claim_ms)
            except (RedisError, OSError):
                failed += 1
                if failed == asked_shards == len(owed or order):
                    raise
                continue
            claims += found
            if len(found) < asked:
                with self._lock:
                    # (Its layout may have been retired meanwhile: no plan left.)
                    plan = self._plans.get(name)
                    if plan is not None:
                        plan.owed = False
        return claims
