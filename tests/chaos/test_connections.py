"""Connections cut under load: ``CLIENT KILL`` of every client, ``CLIENT PAUSE``, and ``DEBUG
SLEEP`` longer than the clients' socket timeout. Workers reconnect on their own; no message
is lost or stuck, and a producer only ever sees errors that say the send may not have
happened."""

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayqueue_django.core.queue import Queue
from tests.chaos import ledger
from tests.chaos.accounting import drain, first_handled_after, tally
from tests.chaos.conftest import queue_settings
from tests.chaos.figures import Figures
from tests.chaos.fleet import WorkerFleet
from tests.chaos.producer import Producer
from tests.redis_servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.chaos

SOCKET_TIMEOUT = 1.0
SLEEP_SECONDS = 2.5  # DEBUG SLEEP: longer than the socket timeout
CONSUME_SECONDS = 4
FAULTS = {
    "kill": "CLIENT KILL",
    "pause": "CLIENT PAUSE 1.5 s",
    "sleep": f"DEBUG SLEEP {SLEEP_SECONDS} s",
}


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def target(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, RedisServer]]:
    """``(backend, url, server to break)``: a single Redis, or the master serving the queue
    on a Redis Cluster (whose client re-sends commands after a timeout on its own)."""
    if request.param == "standalone":
        server = RedisServer("--enable-debug-command", "yes")
        yield "standalone", server.url, server
        server.close()
        return
    # A node timeout longer than the stall, so the other masters do not fail the node over.
    cluster = RedisClusterServers(
        3, 0, "--enable-debug-command", "yes", "--cluster-node-timeout", "8000"
    )
    yield "cluster", cluster.url, cluster.master_for("{delayqueue:default}")
    cluster.close()


def test_cut_paused_and_stalled_connections(
    target: tuple[str, str, RedisServer],
    use_settings: Callable[[dict[str, Any]], Queue],
    fleets: Callable[..., WorkerFleet],
    report_figures: Callable[[Figures], None],
    chaos_rounds: int,
) -> None:
    backend, url, server = target
    config = queue_settings(
        url,
        MAX_CONSUME_DURATION=CONSUME_SECONDS,
        OPTIONS={"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT},
    )
    queue = use_settings(config)
    fleet = fleets(config, "--concurrency", "2", size=2)
    fleet.start()
    fleet.wait_started()
    producer = Producer(queue, rate=400)
    producer.start()
    admin: Any = server.client(socket_timeout=SLEEP_SECONDS + 5)
    rng = random.Random(11)
    fault_ends: dict[str, list[float]] = {"kill": [], "pause": [], "sleep": []}
    problems = []
    for _ in range(chaos_rounds):
        time.sleep(rng.uniform(0.5, 1.0))
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        fault_ends["kill"].append(time.time())
        time.sleep(rng.uniform(0.5, 1.0))
        admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        fault_ends["pause"].append(time.time() + 1.5)
        time.sleep(rng.uniform(1.5, 2.5))
        admin.execute_command("DEBUG", "SLEEP", str(SLEEP_SECONDS))
        fault_ends["sleep"].append(time.time())
        problems += queue.check_invariants().problems
    time.sleep(1.5)
    producer.stop()
    drain(queue, timeout=CONSUME_SECONDS * 3 + 10)
    entries = ledger.read(fleet.ledger)
    result = tally(producer.sent, entries)
    final = queue.check_invariants()
    exit_codes = fleet.stop()

    recoveries = {
        fault: max(first_handled_after(end, producer.sent, entries) for end in ends)
        for fault, ends in fault_ends.items()
    }
    report_figures(
        Figures(
            f"connections cut, {backend}",
            len(producer.sent),
            len(result.lost),
            result.duplicates,
            max(recoveries.values()),
            ", ".join(
                f"{FAULTS[fault]} x{chaos_rounds}: {s:.2f} s" for fault, s in recoveries.items()
            ),
        )
    )
    assert producer.unexpected == []
    assert problems == []
    assert result.lost == []
    assert final.ok, final.problems
    assert final.counts["garbage"] == 0
    assert set(exit_codes.values()) == {0}, fleet.output()
