"""The ordered groups' worker scenario (issue #27), shared by the small test
(tests/test_groups_workers.py) and its chaos size (tests/chaos/test_groups_kill.py): send
sequenced messages in several groups to a fleet of ``run_delayqueue`` workers, wait until
the queue is drained, and check the handlers' records: within a group never two at once and
never out of order, while groups ran in parallel."""

import time
from collections import defaultdict
from itertools import pairwise
from typing import Any

from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Queue
from tests.chaos.fleet import WorkerFleet
from tests.keys_race import journal

HANDLER = "tests.groups_flow.handler.handle"


def worker_settings(url: str, **options: Any) -> dict[str, Any]:
    queue = {"URL": url, "HANDLER": HANDLER, "NACK_REDELIVERY_DELAY": 0, **options}
    return {"DELAYQUEUES": {"default": queue}}


def send_groups(
    queue: Queue, groups: int, per_group: int, special: dict[tuple[int, int], dict[str, Any]]
) -> None:
    """``per_group`` messages in each group, interleaved across groups in send order; the
    payload of (group, seq) gets ``special``'s entries (fail, always_fail, hang...)."""
    items = []
    for seq in range(per_group):
        for group in range(groups):
            payload = {"group": f"g{group}", "seq": seq, **special.get((group, seq), {})}
            retries = 1 if payload.get("always_fail") else None
            items.append(Outgoing(payload, group=f"g{group}", retry_count=retries))
    queue.send_many(items)


def wait_drained(queue: Queue, fleet: WorkerFleet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        stats = queue.stats()
        if not any(stats[state] for state in ("pending", "ready", "unack", "retry")):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not drained: {stats}\n{fleet.output()}")
        time.sleep(0.1)


def deliveries(fleet: WorkerFleet) -> dict[str, list[dict[str, Any]]]:
    """Each group's deliveries, in start order: start and end time, seq, attempt, done
    (None for a delivery whose worker was killed before it ended)."""
    started: dict[tuple[str, int, int], dict[str, Any]] = {}
    for event in journal.read(fleet.ledger):
        slot = (event["id"], event["attempt"], event["pid"])
        if event["event"] == "start":
            started[slot] = {**event, "end": None, "done": None}
        else:
            started[slot].update(end=event["at"], done=event["done"])
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for delivery in sorted(started.values(), key=lambda d: d["at"]):
        by_group[delivery["group"]].append(delivery)
    return dict(by_group)


def check_order(by_group: dict[str, list[dict[str, Any]]], per_group: int) -> None:
    """Within each group: each delivery started after the one before ended (a killed one:
    its message's next delivery is the one after it), seqs never go back, and every seq was
    done, or dead-lettered after its last attempt."""
    for group, runs in by_group.items():
        for before, after in pairwise(runs):
            if before["end"] is not None:
                assert after["at"] >= before["end"], (group, before, after)
            else:
                assert after["id"] == before["id"], ("killed holder passed on", group, after)
            assert after["seq"] >= before["seq"], ("out of order", group, before, after)
        finished = {run["seq"] for run in runs if run["end"] is not None}
        assert finished == set(range(per_group)), (group, finished)


def check_parallel(by_group: dict[str, list[dict[str, Any]]]) -> None:
    """Some deliveries of different groups ran at the same time."""
    spans = [
        (run["at"], run["end"], group)
        for group, runs in by_group.items()
        for run in runs
        if run["end"] is not None
    ]
    assert any(
        a_start < b_end and b_start < a_end and a_group != b_group
        for a_start, a_end, a_group in spans
        for b_start, b_end, b_group in spans
    ), "no two groups ever ran at once"
