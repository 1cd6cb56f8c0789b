"""Nothing lost, nothing twice, across the database and the queue: the outbox and EXACTLY_ONCE
under faults, on SQLite, PostgreSQL and MariaDB, with real worker and relay processes.

- Redis is killed (``kill -9``, AOF always) and restarted while requests commit orders with
  outbox sends, and roll some back: every committed order's message is handled once, no
  rolled-back one ever.
- Relays racing, killed with ``kill -9`` at random moments (mid-batch: they relay in small
  batches all along): no row is lost, none is sent twice.
- Workers of an EXACTLY_ONCE queue killed with ``kill -9`` while their handlers write rows:
  deliveries repeat, the rows do not: none missing, none twice.
"""

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Queue
from delayqueue_django.outbox.models import OutboxMessage
from tests.chaos import ledger
from tests.chaos.accounting import tally
from tests.chaos.conftest import queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.pace import Pace, wait_until_empty, waiting_messages
from tests.databases import NAMES, subprocess_settings
from tests.redis_servers import RedisServer
from tests.task_app.models import Effect

pytestmark = pytest.mark.chaos

CONSUME_SECONDS = 3
EFFECT_HANDLER = "tests.chaos.outbox_handlers.write_effect"
# How long workers are killed while exactly-once handlers write rows (about 15 kills).
KILL_SECONDS = 8


def with_database(config: dict[str, Any], alias: str) -> dict[str, Any]:
    """Chaos settings whose processes use the test database ``alias`` as their default one,
    keeping their connections (CONN_MAX_AGE) as a deployed worker should."""
    databases = subprocess_settings(alias)
    databases["default"]["CONN_MAX_AGE"] = 60
    return {**config, "DATABASES": databases, "DELAYQUEUE_OUTBOX_DATABASES": ["default"]}


def outbox_rows(alias: str) -> int:
    return OutboxMessage.objects.using(alias).count()


def wait_for_empty_outbox(alias: str, floor: float) -> Pace:
    """Until no outbox row is left, within a window set by the pace the rows leave at (see
    tests.chaos.pace), at least ``floor`` seconds."""
    return wait_until_empty(lambda: outbox_rows(alias), "outbox rows", floor)


class WebRequests(threading.Thread):
    """A web process's requests, in a thread until ``stop()``: what ``requests()`` raises is
    kept in ``errors`` for the test to report, and the thread's database connections are
    closed when it ends."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []

    def requests(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            self.requests()
        except BaseException as error:  # reported by the test
            self.errors.append(error)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


class OrderRequests(WebRequests):
    """A web process's requests: each commits an order with its outbox send, or (one in
    four) fails after the send and rolls back, at a steady rate, whatever Redis does."""

    def __init__(self, queue: Queue, alias: str, rate: float) -> None:
        super().__init__("order-requests")
        self.queue, self.alias, self.rate = queue, alias, rate
        self.committed: list[str] = []
        # When each order committed (time.monotonic()), to tell those made while Redis was down.
        self.committed_at: list[float] = []
        self.rolled_back: list[str] = []

    def requests(self) -> None:
        rng = random.Random(11)
        while not self.stopping.wait(1 / self.rate):
            fails = rng.random() < 0.25
            with transaction.atomic(using=self.alias):
                message_id = self.queue.send(
                    {"order": len(self.committed)},
                    delay=rng.choice((0, rng.uniform(0, 0.3))),
                    outbox=True,
                    using=self.alias,
                )
                Effect.objects.using(self.alias).create(message_id=message_id)
                transaction.set_rollback(fails, using=self.alias)
            if fails:
                self.rolled_back.append(message_id)
            else:
                self.committed.append(message_id)
                self.committed_at.append(time.monotonic())


@pytest.mark.chaos_database("default")
def test_redis_killed_while_requests_commit_orders(
    database: str,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_rounds: int,
) -> None:
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    try:
        config = with_database(
            queue_settings(server.url, MAX_CONSUME_DURATION=CONSUME_SECONDS), database
        )
        queue = use_settings({"DELAYQUEUES": config["DELAYQUEUES"]})
        fleet = fleets(config, "--concurrency", "2", size=2)  # relaying, as by default
        fleet.start()
        fleet.wait_started()
        requests = OrderRequests(queue, database, rate=100)
        requests.start()
        rng = random.Random(3)
        outages = []
        # (crashed, restarting): the span in which Redis was surely down.
        down: list[tuple[float, float]] = []
        for _ in range(chaos_rounds):
            time.sleep(rng.uniform(1.0, 2.0))
            crashed_at = time.monotonic()
            server.crash()
            time.sleep(rng.uniform(0.5, 1.5))
            down.append((crashed_at, time.monotonic()))
            server.start()
            outages.append(time.monotonic() - crashed_at)
        time.sleep(1.0)
        requests.stop()
        wait_for_empty_outbox(database, floor=30)
        wait_until_empty(waiting_messages(queue), "messages waiting", CONSUME_SECONDS * 3 + 10)
        exit_codes = fleet.stop()
        entries = ledger.read(fleet.ledger)
        result = tally(requests.committed, entries)
        handled_rolled_back = set(result.handled) & set(requests.rolled_back)
        report_figures(
            Figures(
                f"outbox, Redis kill -9 while orders commit ({NAMES[database]})",
                len(requests.committed),
                len(result.lost),
                result.duplicates,
                None,
                f"{len(outages)} crashes of up to {max(outages):.1f} s; "
                f"{len(requests.rolled_back)} rolled back, {len(handled_rolled_back)} of "
                "them handled",
            )
        )
        assert requests.errors == []  # no request failed for Redis being away
        # Orders went on committing while Redis was down: an outbox send needs no Redis.
        # (Counted per outage, not against a fixed total, which a loaded machine's slower
        # database writes fell short of.)
        committed_while_down = [
            sum(start < at < end for at in requests.committed_at) for start, end in down
        ]
        assert all(committed_while_down), committed_while_down
        assert result.lost == []
        assert result.duplicates == 0
        assert handled_rolled_back == set()
        assert result.unacknowledged == set()
        assert set(exit_codes.values()) == {0}, fleet.output()
    finally:
        server.close()


@pytest.mark.chaos_database("mariadb")
def test_relays_killed_mid_batch_while_racing(
    database: str,
    redis_server: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_messages: int,
    chaos_rounds: int,
) -> None:
    config = with_database(
        queue_settings(redis_server.url, MAX_CONSUME_DURATION=CONSUME_SECONDS), database
    )
    queue = use_settings({"DELAYQUEUES": config["DELAYQUEUES"]})
    ids: list[str] = []
    for start in range(0, chaos_messages, 1000):
        with transaction.atomic(using=database):
            count = min(1000, chaos_messages - start)
            ids += queue.send_many(
                [Outgoing({"n": start + n}) for n in range(count)], outbox=True, using=database
            )
    workers = fleets(config, "--concurrency", "4", "--no-relay", size=2)
    workers.start()
    # Small batches: a relay is nearly always between taking its rows and committing.
    relay_args = ("--batch-size", "20", "--poll", "0.05")
    relays = fleets(config, *relay_args, size=3, command="delayqueue_relay")
    relays_started = time.monotonic()
    relays.start()
    rng = random.Random(9)
    kills = 0
    while outbox_rows(database) and kills < 10 * chaos_rounds:
        time.sleep(rng.uniform(0.05, 0.3))
        relays.kill_one(rng)
        kills += 1
    relays.wait_started()  # the pace is the relays', not their Django's start
    emptied = wait_for_empty_outbox(database, floor=60)
    relayed_in = time.monotonic() - relays_started
    drained = wait_until_empty(
        waiting_messages(queue), "messages waiting", CONSUME_SECONDS * 3 + 10
    )
    relays.stop()
    workers.stop()
    entries = ledger.read(workers.ledger)
    result = tally(ids, entries)
    record = redis_server.client().zcard(queue.store.keys.key("relayed"))
    # The relays that stopped gracefully say how many of their rows a killed one had got
    # into Redis before it died (not written again).
    again = sum(map(int, re.findall(r"\((\d+) relayed before\)", relays.log_text())))
    report_figures(
        Figures(
            f"outbox, relays kill -9 mid-batch, 3 racing ({NAMES[database]})",
            len(ids),
            len(result.lost),
            result.duplicates,
            None,
            f"{kills} kills; rows a killed relay had written, found and not sent again by "
            f"the stopped relays: {again}; relayed-ids record left: {record}; relayed "
            f"{len(ids) / relayed_in:.0f} rows/s overall; after the kills, rows left: "
            f"{emptied}, then messages waiting: {drained}",
        )
    )
    assert kills >= 2
    assert result.lost == []
    assert result.duplicates == 0  # workers are not killed here: a duplicate is a relay's
    assert queue.check_invariants().ok


@pytest.mark.chaos_database("postgresql")
def test_workers_killed_while_exactly_once_handlers_write_rows(
    database: str,
    redis_server: RedisServer,
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_messages: int,
) -> None:
    config = with_database(
        queue_settings(
            redis_server.url,
            HANDLER=EFFECT_HANDLER,
            EXACTLY_ONCE=True,
            MAX_CONSUME_DURATION=CONSUME_SECONDS,
            RETRY_COUNT=10,
        ),
        database,
    )
    queue = use_settings({"DELAYQUEUES": config["DELAYQUEUES"]})
    rng = random.Random(2025)
    count = max(chaos_messages // 3, 200)
    # The messages come due all through the kill window, so the queue is never empty
    # before the kills end, however fast the workers handle them (a run that had them all
    # due in 2 s drained before the second kill).
    ids = queue.send_many(
        [
            Outgoing(
                {"n": n, "work_ms": rng.choice((0, 0, 1, 5))},
                delay=rng.uniform(0, KILL_SECONDS * 0.75),
            )
            for n in range(count)
        ]
    )
    fleet = fleets(config, "--concurrency", "4", size=3)
    handling_started = time.monotonic()
    fleet.start()
    # The kills start with the handling (on a loaded machine the messages could otherwise
    # all be handled before the first of them) and stop after KILL_SECONDS: each kill holds
    # its deliveries back for CONSUME_SECONDS, and a machine slow enough to hand them out
    # more slowly than the kills take them would never see the queue drain.
    fleet.wait_started()
    kills_end = time.monotonic() + KILL_SECONDS
    while any(queue.stats()[state] for state in ("pending", "ready", "retry", "unack")):
        if time.monotonic() > kills_end:
            break
        time.sleep(rng.uniform(0.2, 0.8))
        fleet.kill_one(rng)
    fleet.wait_started()  # the pace is the workers', not their Django's start
    drained = wait_until_empty(waiting_messages(queue), "messages waiting", CONSUME_SECONDS * 10)
    handled_in = time.monotonic() - handling_started
    fleet.stop()
    entries = ledger.read(fleet.ledger)
    deliveries = Counter(entry.id for entry in entries if entry.event == "start")
    rows = Counter(Effect.objects.using(database).values_list("message_id", flat=True))
    missing = [message_id for message_id in ids if rows[message_id] == 0]
    twice = {message_id: n for message_id, n in rows.items() if n > 1}
    report_figures(
        Figures(
            f"exactly once: kill -9 of workers writing rows ({NAMES[database]})",
            len(ids),
            len(missing),
            sum(n - 1 for n in twice.values()),
            None,
            f"{len(fleet.killed)} kills; deliveries repeated: "
            f"{sum(n - 1 for n in deliveries.values())}, rows repeated: 0 allowed; handled "
            f"{len(ids) / handled_in:.0f} messages/s overall; after the kills, messages "
            f"waiting: {drained}",
        )
    )
    assert len(fleet.killed) >= 2
    assert missing == []
    assert twice == {}
    assert set(rows) == set(ids)
