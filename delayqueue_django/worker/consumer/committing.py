"""A consumer's verdicts, as the handler threads report them (ConsumerState.report):
committed in batches (one round trip per kind), then counted and signalled; and the
exhausted messages announced."""

import logging
import time
from collections.abc import Sequence

from redis.exceptions import RedisError

from delayqueue_django.core.message import Message
from delayqueue_django.engine.errors import is_outage, timed_out
from delayqueue_django.engine.sharding.layouts import SHARD_RETRY_SECONDS
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.worker import verdicts
from delayqueue_django.worker.consumer.pool import ConsumerPool
from delayqueue_django.worker.handling import Outcome, Verdict

logger = logging.getLogger("delayqueue_django.worker")


# After announcing exhaustions failed, wait this long before claiming again.
ANNOUNCE_RETRY_SECONDS = 1.0


class ConsumerVerdicts(ConsumerPool):
    """Committing the verdicts, and announcing exhaustions."""

    def _hand_back(self, messages: Sequence[Message]) -> None:
        """Release buffered messages that never started, ahead of any verdict waiting to be
        committed. If Redis does not answer, they wait in line to be released when it does
        (a failure raises, for the loop to back off), rather than time out using an
        attempt; they count as in flight until then."""
        if not messages:
            return
        outcomes = [Outcome(message, Verdict.RELEASE) for message in messages]
        for shard, part in reversed(verdicts.by_shard(outcomes).items()):
            self._commits.appendleft(verdicts.Commit(Verdict.RELEASE, part, shard=shard))
        self._send_commits()

    # Verdicts

    def _flush(self, *, force: bool = False) -> None:
        """Commit the handlers' verdicts: all of them when ``force``d, else once the oldest
        has waited VERDICT_FLUSH_SECONDS or a batch is full; commits that failed before go
        first, and at once."""
        with self._lock:
            outcomes: list[Outcome] = []
            if self._outcomes:
                due = self._verdicts_due_at
                if (
                    force
                    or self._commits
                    or len(self._outcomes) >= self._batch_limit
                    or time.monotonic() >= due
                ):
                    outcomes, self._outcomes = self._outcomes, []
        if outcomes:
            self._line_up(outcomes)
        self._send_commits()

    def _line_up(self, outcomes: list[Outcome]) -> None:
        """Queue outcomes for committing: one commit per verdict, each its own request."""
        by_verdict: dict[Verdict, list[Outcome]] = {verdict: [] for verdict in Verdict}
        for outcome in outcomes:
            by_verdict[outcome.verdict].append(outcome)
        if by_verdict[Verdict.RELEASE]:
            self._shrink_batch()
        for verdict in verdicts.COMMIT_ORDER:
            for shard, part in verdicts.by_shard(by_verdict[verdict]).items():
                request = str(next(self._commit_requests))
                self._commits.append(verdicts.Commit(verdict, part, request, shard))

    def _send_commits(self) -> None:
        """Send the queued commits in order. One that raises stays first in line, to be sent
        again as it was by the next flush (after the loop's backoff): the same request, so
        that if Redis ran it and only the reply was lost, the repeat is told what it did.
        Those committed before it are counted and signalled all the same, once.

        On a queue of many shards, a commit to a shard that cannot be reached stays in line
        with the rest of its shard's, tried again after SHARD_RETRY_SECONDS, while the other
        shards' go on: a master down holds up only its own messages (its fetches are left
        out the same way, see engine.sharding.fetch)."""
        committed: list[Outcome] = []
        exhausted = False
        now = time.monotonic()
        held = {shard for shard, at in self._shard_retry_at.items() if at > now}
        waiting: list[verdicts.Commit] = []
        try:
            while self._commits:
                commit = self._commits[0]
                if commit.shard in held:
                    waiting.append(self._commits.popleft())
                    continue
                try:
                    exhausted |= verdicts.commit(
                        self.queue,
                        commit.verdict,
                        commit.outcomes,
                        fetcher=self._fetcher,
                        request=commit.request,
                    )
                except Exception as error:
                    # One shard's failure, whether its master is away or refuses (a full
                    # disk's MISCONF, say), holds up its own commits only, as fetches
                    # pass over it.
                    if not (isinstance(error, RedisError | OSError) and self._spread()):
                        raise
                    first = commit.shard not in self._shard_retry_at
                    self._shard_retry_at[commit.shard] = now + SHARD_RETRY_SECONDS
                    held.add(commit.shard)
                    waiting.append(self._commits.popleft())
                    if timed_out(error):
                        # Its server did not answer in time: the commits to its other
                        # shards would each wait out a timeout too.
                        self._hold_siblings(commit.shard, now, held)
                    # A refusal is news for whoever runs Redis (once, at its first failure);
                    # an outage is said by the fetches and the outage log.
                    logger.log(
                        logging.WARNING if first and not is_outage(error) else logging.DEBUG,
                        "commit to shard %s failed queue=%s: %s; its verdicts wait, trying "
                        "again every %g s",
                        commit.shard,
                        self.queue.name,
                        error,
                        SHARD_RETRY_SECONDS,
                    )
                    continue
                self._commits.popleft()
                self._shard_retry_at.pop(commit.shard, None)
                committed += commit.outcomes
        finally:
            # In their order, ahead of any that raised: each shard's stay in order.
            self._commits.extendleft(reversed(waiting))
            if committed:
                self._settle(committed, exhausted=exhausted)

    def _hold_siblings(self, shard: str, now: float, held: set[str]) -> None:
        store = self.queue.store
        assert isinstance(store, ShardedStore)  # only a spread queue holds commits
        queued = {commit.shard for commit in self._commits}
        for sibling in store.hold_siblings(shard):
            if sibling in queued:
                self._shard_retry_at[sibling] = now + SHARD_RETRY_SECONDS
                held.add(sibling)

    def _spread(self) -> bool:
        """Whether this queue reads more than one shard."""
        store = self.queue.store
        return isinstance(store, ShardedStore) and store.shard_count > 1

    def _settle(self, committed: list[Outcome], *, exhausted: bool) -> None:
        """Account for committed outcomes: counted, no longer in flight, exhaustions owed."""
        # Counted first: between the two, a consumer reserving its share of --max-messages
        # would otherwise see them neither handled nor in flight, and count on them again.
        # One pass over them (every message a worker handles comes through here).
        acked = released = failed = 0
        for outcome in committed:
            verdict = outcome.verdict
            if verdict is Verdict.ACK:
                acked += 1
            elif verdict is Verdict.RELEASE:
                released += 1
            elif not outcome.postponed:  # a NACK or BURY
                failed += 1
        self.worker.count(handled=len(committed) - released, failed=failed)
        with self._lock:
            self._in_flight -= len(committed)
            idle = self._in_flight == 0
        if released:
            self.worker.shares_freed()
        if acked < len(committed) or (idle and self.worker.burst) or self._capped:
            # Retries and hand-backs change what is due: look again; so does a burst run
            # with nothing left in hand, which ends on the look that finds the queue empty,
            # and an ack while MAX_IN_FLIGHT holds work back: the slot it frees is taken at
            # once, not at the held-back fetch's look a second on.
            # Other acks only take work away: the last fetch's plan stands (a message sent
            # since, due earlier, announced itself), so at a trickle an ack costs no fetch.
            self._woken = True
        if exhausted:
            # After the commit, and never failing it: see _announce_exhaustions.
            self._announce_exhaustions()

    def _announce_exhaustions(self) -> bool:
        """Announce owed exhaustions; False if that has to wait. A failure (Redis away, or
        out of memory: a claim is a write) leaves them owed for a later try, and never fails
        the fetch or the commit that found them."""
        if time.monotonic() < self._announce_after:
            return False
        try:
            verdicts.announce_exhaustions(self.queue)
        except RedisError as error:
            self._announce_after = time.monotonic() + ANNOUNCE_RETRY_SECONDS
            self._failed(
                "announcing exhausted messages failed",
                error,
                f"trying again in {ANNOUNCE_RETRY_SECONDS:.0f} s",
            )
            return False
        return True
