"""The outbox under partial outages, with real worker processes relaying and handling while
a web process commits outbox sends at a steady rate:

- one queue's Redis stopped: the other queue's messages keep their throughput;
- one master of three paused (SIGSTOP: its sockets hang until the timeout) under a queue of
  6 shards: the shards of the other masters keep theirs.

Each measures the rate at which the healthy messages' rows leave the outbox for Redis
during the outage, beside the same rate just before it (and the rate at which they are
handled), then brings the sick Redis back: every committed message is handled.
Small in make test (5 s per phase), 15 s per phase under make chaos (``--chaos-rounds``).
"""

import signal
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import pytest
from django.db import transaction

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.sharding.placement import shard_keys, shard_name, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore
from delayqueue_django.models import OutboxMessage
from delayqueue_django.outbox.relay import LANE_PATIENCE_SECONDS
from tests.chaos import ledger
from tests.chaos.accounting import drain, tally
from tests.chaos.conftest import HANDLER
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.ledger import Entry
from tests.chaos.test_outbox_faults import (
    WebRequests,
    outbox_rows,
    wait_for_empty_outbox,
    with_database,
)
from tests.databases import NAMES
from tests.redis_servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.chaos

# Outbox sends committed per second, over all queues.
RATE = 100
CONSUME_SECONDS = 3
# The healthy messages' rate during the outage, against the rate before it, at least.
KEPT_SHARE = 0.75


@pytest.fixture
def phase_seconds(chaos_rounds: int) -> float:
    """How long the rate is measured before the outage, and during it: long enough that
    the one wait a relay spends on a hung lane before holding it back
    (LANE_PATIENCE_SECONDS) weighs as it would in a real outage, not the whole phase."""
    return max(3.0 * chaos_rounds, 5 * LANE_PATIENCE_SECONDS)


class OutboxSends(WebRequests):
    """A web process: one outbox send per transaction, at RATE, round robin over
    ``queues``; keeps each committed id with its queue."""

    def __init__(self, queues: list[Queue], alias: str) -> None:
        super().__init__("outbox-sends")
        self.queues, self.alias = queues, alias
        self.committed: dict[str, str] = {}  # id -> queue name
        self.committed_at: dict[str, float] = {}  # id -> time.time() after its commit

    def requests(self) -> None:
        n = 0
        next_send = time.monotonic()
        while not self.stopping.wait(max(next_send - time.monotonic(), 0)):
            queue = self.queues[n % len(self.queues)]
            with transaction.atomic(using=self.alias):
                message_id = queue.send({"n": n}, outbox=True, using=self.alias)
            self.committed[message_id] = queue.name
            self.committed_at[message_id] = time.time()
            n += 1
            next_send = max(next_send + 1 / RATE, time.monotonic() - 1)


class Phases:
    """When the phases began (time.time()), and how many of the healthy messages' rows
    waited in the outbox then."""

    def __init__(self, waiting: Callable[[], int]) -> None:
        self.waiting = waiting
        self.at: dict[str, float] = {}
        self.rows: dict[str, int] = {}

    def mark(self, name: str) -> None:
        self.at[name] = time.time()
        self.rows[name] = self.waiting()

    def relayed(self, sends: OutboxSends, ids: Collection[str], start: str, end: str) -> float:
        """The healthy rows that left the outbox between two marks, per s: those committed
        meanwhile, plus those waiting at the first, less those waiting at the second."""
        committed = sum(
            self.at[start] <= sends.committed_at[message_id] < self.at[end] for message_id in ids
        )
        left = committed + self.rows[start] - self.rows[end]
        return left / (self.at[end] - self.at[start])


def rate(entries: list[Entry], ids: Collection[str], start: float, end: float) -> float:
    """Messages of ``ids`` first handled between ``start`` and ``end`` (time.time()), per s."""
    first: dict[str, float] = {}
    for entry in entries:
        if entry.event == "done" and entry.id in ids:
            first.setdefault(entry.id, entry.time)
    return sum(start <= at < end for at in first.values()) / (end - start)


def caught_up(entries: list[Entry], ids: Collection[str], since: float) -> float:
    """Seconds from ``since`` until the last of ``ids`` was handled."""
    done = [entry.time for entry in entries if entry.event == "done" and entry.id in ids]
    return max(max(done, default=since) - since, 0.0)


def run_outage(
    sends: OutboxSends,
    fleet: WorkerFleet,
    phase_seconds: float,
    phases: Phases,
    fail: Callable[[], None],
    recover: Callable[[], None],
) -> None:
    """A phase of sends before the outage ("before"), one during it ("during"), then the
    sick Redis back ("ended")."""
    fleet.start()
    fleet.wait_started()
    sends.start()
    time.sleep(1.0)  # the relays and workers at their pace
    phases.mark("before")
    time.sleep(phase_seconds)
    phases.mark("during")
    fail()
    time.sleep(phase_seconds)
    phases.mark("ended")
    recover()
    time.sleep(1.0)
    sends.stop()


def figures_note(
    what: str, phases: Phases, sends: OutboxSends, entries: list[Entry], ids: Collection[str]
) -> tuple[str, dict[str, float]]:
    """The healthy messages' rates before and during the outage, relayed and handled."""
    at = phases.at
    rates = {
        "relayed before": phases.relayed(sends, ids, "before", "during"),
        "relayed during": phases.relayed(sends, ids, "during", "ended"),
        "handled before": rate(entries, ids, at["before"], at["during"]),
        "handled during": rate(entries, ids, at["during"], at["ended"]),
    }
    return (
        f"{what}: relayed {rates['relayed before']:.0f} msg/s before, "
        f"{rates['relayed during']:.0f} during; handled {rates['handled before']:.0f} msg/s "
        f"before, {rates['handled during']:.0f} during. Recovery: until the last held "
        "message was handled",
        rates,
    )


@pytest.fixture
def sick_redis() -> Iterator[RedisServer]:
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    yield server
    server.close()


@pytest.mark.chaos_database("default")
def test_one_queues_redis_down_while_the_other_queue_flows_through_the_outbox(
    database: str,
    redis_server: RedisServer,
    sick_redis: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    phase_seconds: float,
) -> None:
    def queue(url: str) -> dict[str, Any]:
        return {
            "URL": url,
            "HANDLER": HANDLER,
            "NACK_REDELIVERY_DELAY": 0,
            "MAX_CONSUME_DURATION": CONSUME_SECONDS,
            "OPTIONS": {"socket_timeout": 2},
        }

    queues = {"default": queue(redis_server.url), "sick": queue(sick_redis.url)}
    config = with_database({"DELAYQUEUES": queues}, database)
    use_settings({"DELAYQUEUES": queues})
    healthy, sick = get_queue("default"), get_queue("sick")
    fleet = fleets(config, "default", "sick", "--concurrency", "2", size=2)
    sends = OutboxSends([healthy, sick], database)
    phases = Phases(lambda: OutboxMessage.objects.using(database).filter(queue="default").count())

    run_outage(sends, fleet, phase_seconds, phases, fail=sick_redis.stop, recover=sick_redis.start)

    wait_for_empty_outbox(database, floor=60)
    drain(healthy, timeout=CONSUME_SECONDS * 3 + 10)
    drain(sick, timeout=CONSUME_SECONDS * 3 + 10)
    fleet.stop()
    entries = ledger.read(fleet.ledger)
    result = tally(sends.committed, entries)
    healthy_ids = {i for i, name in sends.committed.items() if name == "default"}
    held_ids = {i for i, name in sends.committed.items() if name == "sick"}
    note, rates = figures_note("the other queue", phases, sends, entries, healthy_ids)
    report_figures(
        Figures(
            f"outbox, one queue's Redis down {phase_seconds:.0f} s ({NAMES[database]})",
            len(sends.committed),
            len(result.lost),
            result.duplicates,
            caught_up(entries, held_ids, phases.at["ended"]),
            note,
        )
    )
    assert sends.errors == []
    assert result.lost == []
    assert result.duplicates == 0
    assert outbox_rows(database) == 0
    # Its own Redis, its own consumer: the healthy queue keeps both rates.
    for step in ("relayed", "handled"):
        usual, kept = rates[f"{step} before"], rates[f"{step} during"]
        assert usual > 0
        assert kept >= KEPT_SHARE * usual, f"{step}: {kept:.1f} msg/s during, {usual:.1f} before"


@pytest.mark.cluster
@pytest.mark.chaos_database("postgresql")
def test_one_master_paused_under_a_queue_of_6_shards_on_3_masters(
    database: str,
    cluster: RedisClusterServers,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    phase_seconds: float,
) -> None:
    queues = {
        "default": {
            "URL": cluster.url,
            "SHARDS": 6,
            "HANDLER": HANDLER,
            "NACK_REDELIVERY_DELAY": 0,
            # Under the socket timeout (5 s): a delivery of the other shards that waited
            # for the paused master's would be delivered again.
            "MAX_CONSUME_DURATION": CONSUME_SECONDS,
        }
    }
    config = with_database({"DELAYQUEUES": queues}, database)
    queue = use_settings({"DELAYQUEUES": queues})
    store = queue.store
    assert isinstance(store, ShardedStore)
    # Neither shard 0's master (the register of layouts) nor the URL's seed node.
    spared = {cluster.nodes[0], cluster.master_for(store.keys.tag)}
    paused = next(node for node in cluster.nodes if node not in spared)
    paused_shards = {
        shard_name(6, index)
        for index in range(1, 6)
        if cluster.master_for(shard_keys(store.keys, 6, index).tag) is paused
    }
    assert paused_shards
    assert paused.process is not None
    process = paused.process
    fleet = fleets(config, "--concurrency", "2", size=2)
    sends = OutboxSends([queue], database)

    def on_paused_master(message_id: str) -> bool:
        return shard_name(*shard_of(message_id)) in paused_shards

    def healthy_rows() -> int:
        ids = OutboxMessage.objects.using(database).values_list("message_id", flat=True)
        return sum(not on_paused_master(message_id) for message_id in ids)

    phases = Phases(healthy_rows)
    run_outage(
        sends,
        fleet,
        phase_seconds,
        phases,
        fail=lambda: process.send_signal(signal.SIGSTOP),
        recover=lambda: process.send_signal(signal.SIGCONT),
    )

    wait_for_empty_outbox(database, floor=60)
    drain(queue, timeout=CONSUME_SECONDS * 3 + 30)
    fleet.stop()
    entries = ledger.read(fleet.ledger)
    result = tally(sends.committed, entries)
    held_ids = set(filter(on_paused_master, sends.committed))
    healthy_ids = set(sends.committed) - held_ids
    note, rates = figures_note("the other shards", phases, sends, entries, healthy_ids)
    report_figures(
        Figures(
            f"outbox, 1 of 3 masters paused {phase_seconds:.0f} s, SHARDS 6 ({NAMES[database]})",
            len(sends.committed),
            len(result.lost),
            result.duplicates,
            caught_up(entries, held_ids, phases.at["ended"]),
            note,
        )
    )
    assert sends.errors == []
    assert result.lost == []
    # At least once: a delivery whose ack the paused master never answered comes back
    # after MAX_CONSUME_DURATION. The other shards' messages are handled once.
    assert all(result.handled[message_id] == 1 for message_id in healthy_ids)
    # The relay and the workers keep the other shards' rates: neither waits on the paused
    # master but once, FETCH_PATIENCE_SECONDS / LANE_PATIENCE_SECONDS at the most.
    for step in ("relayed", "handled"):
        usual, kept = rates[f"{step} before"], rates[f"{step} during"]
        assert usual > 0
        assert kept >= KEPT_SHARE * usual, f"{step}: {kept:.1f} msg/s during, {usual:.1f} before"
