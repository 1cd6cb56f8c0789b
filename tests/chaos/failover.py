"""The end of a failover scenario (Redis Cluster or Sentinel): let the queue drain, then
check the ledger against what was sent, report the figures, and allow losses only inside
the asynchronous-replication window before each kill."""

import time
from collections.abc import Callable

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.invariants import Problem
from tests.chaos import ledger
from tests.chaos.accounting import drain, first_handled_after, lost_outside_windows, tally
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.producer import Producer

# Seconds of acknowledged writes before a kill that a failover may lose, allowed.
REPLICATION_WINDOW = 1.0


def conclude_failover(
    scenario: str,
    queue: Queue,
    fleet: WorkerFleet,
    producer: Producer,
    failovers: list[tuple[float, float]],
    problems: list[Problem],
    report_figures: Callable[[Figures], None],
    *,
    consume_seconds: float,
) -> None:
    """``failovers``: (killed at, promoted by) pairs; ``problems``: invariant problems seen
    right after each failover."""
    time.sleep(1.5)
    producer.stop()
    drain(queue, timeout=consume_seconds * 3 + 15)
    entries = ledger.read(fleet.ledger)
    result = tally(producer.sent, entries)
    final = queue.check_invariants()
    exit_codes = fleet.stop()

    report_figures(
        Figures(
            scenario,
            len(producer.sent),
            len(result.lost),
            result.duplicates,
            max(first_handled_after(back, producer.sent, entries) for _, back in failovers),
            f"failovers: {len(failovers)}, each {max(b - k for k, b in failovers):.1f} s at "
            "most; recovery from the promotion",
        )
    )
    assert producer.unexpected == []
    assert problems == []
    assert lost_outside_windows(result, producer.sent, failovers, REPLICATION_WINDOW) == []
    assert final.ok, final.problems
    assert final.counts["garbage"] == 0
    assert set(exit_codes.values()) == {0}, fleet.output()
