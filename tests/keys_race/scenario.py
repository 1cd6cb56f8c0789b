"""The race and what must hold after it (see tests/test_keys_race.py)."""

import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.invariants import parse_snapshot
from delayqueue_django.engine.sharding.store import parts
from tests.chaos.fleet import ROOT, WorkerFleet
from tests.keys_race import journal

HANDLER = "tests.keys_race.handler.handle"
WAITING = ("pending", "ready", "retry")


@dataclass
class Samples:
    taken: int = 0
    # Every time a snapshot found two waiting messages with one key: (key, ids).
    twice: list[tuple[str, list[str]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def worker_settings(url: str, **options: Any) -> dict[str, Any]:
    """Settings of the race's queue, for the workers and producers (and this process)."""
    queue = {"URL": url, "HANDLER": HANDLER, "NACK_REDELIVERY_DELAY": 0, **options}
    return {"DELAYQUEUES": {"default": queue}}


def race(
    queue: Queue, fleet: WorkerFleet, *, producers: int, seconds: float, keys: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Samples]:
    """Run the producers against the fleet while sampling the queue; wait until the queue
    is drained and the workers stopped. Returns (producers' events, deliveries, samples)."""
    calls = fleet.folder / "calls"
    calls.mkdir()
    fleet.start()
    fleet.wait_started()
    command = [sys.executable, "-m", "tests.keys_race.producer"]
    names = ",".join(f"key-{n}" for n in range(keys))
    running = [
        subprocess.Popen(
            [*command, str(calls), f"p{n}", str(seconds), names],
            env=fleet.environment,
            cwd=ROOT,
        )
        for n in range(producers)
    ]
    samples = Samples()
    while any(process.poll() is None for process in running):
        sample(queue, samples)
        time.sleep(0.02)
    assert [process.returncode for process in running] == [0] * producers
    deadline = time.monotonic() + 30
    while True:
        sample(queue, samples)
        counts = queue.check_invariants().counts
        if not any(counts[state] for state in (*WAITING, "unack")):
            break
        assert time.monotonic() < deadline, f"the queue did not drain: {counts}"
        time.sleep(0.1)
    assert set(fleet.stop().values()) == {0}, fleet.output()
    return journal.read(calls), journal.read(fleet.ledger), samples


def sample(queue: Queue, samples: Samples) -> None:
    """One atomic snapshot of each shard (a key's messages all live on its shard): the
    waiting messages grouped by key, and the invariant checker's verdict on it."""
    samples.taken += 1
    for store in parts(queue.store).values():
        snapshot = parse_snapshot(store.snapshot(), store.keys)
        waiting: dict[str, list[str]] = defaultdict(list)
        for state in WAITING:
            for message_id in snapshot.states[state] or ():
                key = snapshot.message_keys.get(message_id)
                if key is not None:
                    waiting[key].append(message_id)
        samples.twice += [(key, ids) for key, ids in waiting.items() if len(ids) > 1]
    samples.problems += [str(problem) for problem in queue.check_invariants().problems]


def check(
    events: list[dict[str, Any]],
    deliveries: list[dict[str, Any]],
    samples: Samples,
    superseded: int,
) -> None:
    """What must hold once the race is over and the queue drained (``superseded``: the
    queue's total of superseded messages)."""
    assert samples.taken > 10
    assert samples.twice == [], f"two messages waited with one key: {samples.twice[:5]}"
    assert samples.problems == [], samples.problems[:10]

    sends = [event for event in events if event["op"] == "send"]
    created = {event["id"]: event for event in sends if event["outcome"] == "created"}
    # The sends that wrote each id's content: the one that created it and those that
    # replaced it.
    writers: dict[str, set[str]] = defaultdict(set)
    for event in sends:
        if event["outcome"] in ("created", "replaced"):
            writers[event["id"]].add(event["send"])
        if event["outcome"] == "created":
            assert event["id"] == event["new_id"], event
        else:  # kept, replaced, held or refused: the key named a message a send created
            assert event["id"] in created, f"answered with an id never created: {event}"
            assert created[event["id"]]["key"] == event["key"], event

    # Each id handled once: a message handed out is no longer waiting, so nothing can
    # replace or reschedule it, and a key's next send creates a new id; only a failed
    # delivery brings it back (no kills here, so no delivery is cut and repeated).
    handled = Counter(delivery["id"] for delivery in deliveries if delivery["done"])
    assert [i for i, n in handled.items() if n > 1] == [], "handled twice"
    for delivery in deliveries:
        made = created.get(delivery["id"])
        assert made is not None, f"handed out a message no send created: {delivery}"
        assert delivery["key"] == made["key"], delivery
        assert delivery["generation"] > 0, delivery
        assert delivery["send"] in writers[delivery["id"]], f"content of no send: {delivery}"

    cancelled = Counter(
        event["removed"] if event["op"] == "cancel_key" else event["id"]
        for event in events
        if event["op"] in ("cancel_key", "cancel_id") and event["removed"]
    )
    assert [i for i, n in cancelled.items() if n > 1] == [], "cancelled twice"
    assert set(cancelled) <= set(created), "cancelled an id no send created"
    assert set(cancelled).isdisjoint(handled), "both cancelled and handled"
    # A message whose delivery failed while a newer one with its key waited was superseded:
    # removed on its way back, and counted so.
    failed = {delivery["id"] for delivery in deliveries if not delivery["done"]}
    gone = failed - set(handled) - set(cancelled)
    assert len(gone) == superseded, f"{len(gone)} failed and gone, {superseded} superseded"
    lost = set(created) - set(handled) - set(cancelled) - gone
    assert lost == set(), f"created, then neither handled nor cancelled: {sorted(lost)[:5]}"

    # The race went through every path (else it proves less than it says).
    outcomes = Counter(event["outcome"] for event in sends)
    assert all(outcomes[outcome] for outcome in ("created", "kept", "replaced", "error")), outcomes
    assert cancelled
    assert superseded
    assert any(event.get("done") for event in events if event["op"] == "reschedule_key")
    assert any(event.get("done") for event in events if event["op"] == "reschedule_id")


def summary(events: list[dict[str, Any]], deliveries: list[dict[str, Any]]) -> str:
    """What the race did, in a line (for the chaos figures table)."""
    done = Counter(
        event.get("outcome") or event["op"]
        for event in events
        if event.get("outcome") or event.get("done") or event.get("removed")
    )
    parts = [f"{n} {name}" for name, n in sorted(done.items())]
    handled = sum(delivery["done"] for delivery in deliveries)
    failed = len(deliveries) - handled
    return f"{handled} handled, {failed} failed deliveries; " + ", ".join(parts)


def drained_and_sound(queue: Queue) -> None:
    """Afterwards: nothing left, and the key index empty (every pointer dropped)."""
    report = queue.check_invariants()
    assert report.ok, report.problems
    assert report.counts == dict.fromkeys(report.counts, 0), report.counts
    for store in parts(queue.store).values():
        snapshot = parse_snapshot(store.snapshot(), store.keys)
        assert snapshot.key_index == {}, snapshot.key_index
