"""Reading a ``ShardedStore`` as one queue: stats, counts, pages and garbage, each over
every shard it reads (the live and the draining ones)."""

from collections.abc import Mapping

from delayqueue_django.engine.metrics import MetricsRead, merged
from delayqueue_django.engine.records import StoredMessage
from delayqueue_django.engine.sharding.layouts import ShardLayouts
from delayqueue_django.engine.sharding.stats import partial_stats, read_stats


class ShardReads(ShardLayouts):
    """The part of a ``ShardedStore`` that reads across its shards and adds them up."""

    def drop_garbage(
        self,
        *,
        older_than_ms: int | None,
        limit: int,
        keep_unannounced: bool,
        offset: int = 0,
        buried_before_ms: int | None = None,
    ) -> tuple[int, int]:
        """Every shard to its end, each in calls of ``limit`` that pass over what the
        shard's earlier calls kept. The caller's ``offset`` counts over all shards, which
        names no place in any one, so one call does the whole work: it reports nothing kept,
        and a caller that goes on because ``limit`` were dropped finds nothing more."""
        dropped = 0
        for store in self.consumed().values():
            kept = 0
            while True:
                dropped_now, kept_now = store.drop_garbage(
                    older_than_ms=older_than_ms,
                    limit=limit,
                    keep_unannounced=keep_unannounced,
                    offset=kept,
                    buried_before_ms=buried_before_ms,
                )
                dropped += dropped_now
                kept += kept_now
                if dropped_now + kept_now < limit:
                    break
        return dropped, 0

    def stats(self) -> dict[str, int]:
        """The shards' stats added up (see combined_stats), over those that could be read
        (see read_stats), and ``shards_down``: how many could not. Raises the first error
        only when none could be read."""
        read = read_stats(self.consumed())
        answered = [stats for stats in read.values() if not isinstance(stats, Exception)]
        if not answered:
            raise next(stats for stats in read.values() if isinstance(stats, Exception))
        return partial_stats(answered, len(read))

    def metrics(self, back_minutes: int) -> MetricsRead:
        """Every shard's history, to be added up by minute (see engine.metrics.merged)."""
        return merged(store.metrics(back_minutes) for store in self.consumed().values())

    def prune_throughput(self) -> int:
        return sum(store.prune_throughput() for store in self.consumed().values())

    def add_totals(self, increments: Mapping[str, int]) -> None:
        """Worker-measured counts belong to no shard: kept on shard 0."""
        self.base.add_totals(increments)

    def totals(self) -> dict[str, int]:
        summed: dict[str, int] = {}
        for store in self.consumed().values():
            for name, count in store.totals().items():
                summed[name] = summed.get(name, 0) + count
        return summed

    def list(
        self, state: str, *, offset: int, limit: int, preview_bytes: int
    ) -> list[StoredMessage]:
        """A page over every shard: sorted sets merged by score (due time, deadline, burial
        time), lists one shard after the other. Each shard is read up to the page's end,
        so a deep page costs every shard that many entries."""
        stores = list(self.consumed().values())
        if len(stores) == 1:
            return stores[0].list(state, offset=offset, limit=limit, preview_bytes=preview_bytes)
        pages = [
            store.list(state, offset=0, limit=offset + limit, preview_bytes=preview_bytes)
            for store in stores
        ]
        merged = [message for page in pages for message in page]
        if state not in ("ready", "retry"):
            merged.sort(key=lambda message: message.score_ms or 0)
        return merged[offset : offset + limit]
