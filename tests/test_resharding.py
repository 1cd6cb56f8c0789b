"""Changing a queue's SHARDS on a live queue: the register of layouts on shard 0, the
draining of earlier layouts by fetches and readers, and retiring a drained layout."""

import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.records import NewMessage
from delayqueue_django.engine.sharding import layouts as shard_layouts
from delayqueue_django.engine.sharding.placement import LAYOUTS_CHANGED, layout_names, shard_of
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from delayqueue_django.outbox.relay import OutboxRelay
from tests.conftest import MEMORY_URL
from tests.helpers import wait_for
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.test_shards import sharded, sharded_queue
from tests.test_worker_processes import WorkerProcess, events


@pytest.fixture(params=["memory", "redis"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return MEMORY_URL
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    return server.url


@pytest.fixture
def fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each store reads the register at every look: these tests change it between calls
    (a worker reads it every LAYOUTS_RECHECK_SECONDS)."""
    monkeypatch.setattr(shard_layouts, "LAYOUTS_RECHECK_SECONDS", 0.0)


def with_shards(settings: Any, url: str, shards: int) -> Queue:
    settings.DELAYQUEUES = {
        "default": {"URL": url, "SHARDS": shards, "RETRY_COUNT": 0, "NACK_REDELIVERY_DELAY": 0}
    }
    queue = get_queue()
    assert isinstance(queue.store, ShardedStore)
    assert queue.store.layout == shards
    return queue


def drain(queue: Queue, expected: int, timeout: float = 10) -> Counter[str]:
    """Fetch and ack until ``expected`` deliveries came (or the time is up)."""
    handled: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while sum(handled.values()) < expected and time.monotonic() < deadline:
        fetched = queue.fetch(50)
        queue.ack(fetched.messages)
        handled.update(message.id for message in fetched.messages)
        if not fetched.messages:
            time.sleep(0.01)
    return handled


@pytest.mark.usefixtures("fresh_layouts")
def test_four_to_eight_to_two_delivers_every_message_once(settings: Any, url: str) -> None:
    sent = []
    for shards in (4, 8, 2):
        queue = with_shards(settings, url, shards)
        sent += queue.send_many([{"n": n} for n in range(40)])
    # Every layout's shards got messages, and registered itself first.
    assert {shard_of(message_id)[0] for message_id in sent} == {1, 2, 4, 8}
    assert queue.store.base.layouts() == {2, 4, 8}  # type: ignore[attr-defined]

    handled = drain(queue, len(sent))

    assert handled == Counter(sent)
    assert queue.stats()["pending"] == 0


@pytest.mark.usefixtures("fresh_layouts")
def test_readers_count_find_and_cancel_what_an_earlier_layout_holds(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    ids = old.send_many([{"n": n} for n in range(20)], delay=60)
    on_other_shards = [message_id for message_id in ids if shard_of(message_id) != (1, 0)]

    queue = with_shards(settings, url, 1)

    assert sorted(parts(queue.store)) == sorted(layout_names(4))
    assert queue.stats()["pending"] == 20
    listed = queue.list_messages("pending", limit=50)
    assert sorted(message.id for message in listed) == sorted(ids)
    assert queue.peek(on_other_shards[0]) is not None
    assert queue.cancel(on_other_shards[0])
    assert queue.stats()["pending"] == 19
    assert queue.check_invariants().ok


@pytest.mark.usefixtures("fresh_layouts")
def test_a_message_of_a_draining_layout_is_fetched_when_due(settings: Any, url: str) -> None:
    old = with_shards(settings, url, 4)
    ids = old.send_many([{"n": n} for n in range(8)], delay=0.3)
    queue = with_shards(settings, url, 2)

    first = queue.fetch(50)
    assert first.messages == []
    # The earliest due time of every shard it drains, not "nothing pending".
    assert first.next_ms is not None
    assert first.next_ms > first.now_ms

    handled = drain(queue, len(ids))

    assert handled == Counter(ids)


@pytest.mark.usefixtures("fresh_layouts")
def test_retire_takes_a_drained_layout_off_the_register_and_refuses_one_that_holds_any(
    settings: Any, url: str
) -> None:
    old = with_shards(settings, url, 4)
    old.send_many([{"n": n} for n in range(12)])
    queue = with_shards(settings, url, 2)
    fetched = queue.fetch(50)
    assert len(fetched.messages) == 12
    # One of layout 4's is refused: with no retry left, a dead letter on its shard.
    dead = next(message for message in fetched.messages if shard_of(message.id)[0] == 4)
    queue.nack([dead])
    queue.ack([message for message in fetched.messages if message is not dead])

    with pytest.raises(CommandError, match=r"layout 4 still holds messages \(4\.\d: 1 garbage"):
        call_command("delayqueue_shards", "default", "--retire", "4")
    with pytest.raises(CommandError, match="is this queue's SHARDS"):
        call_command("delayqueue_shards", "default", "--retire", "2")
    # (Layout 2 sent nothing: a layout is registered by its first write.)
    assert queue.store.base.layouts() == {4}  # type: ignore[attr-defined]

    assert queue.purge_garbage() == 1
    call_command("delayqueue_shards", "default", "--retire", "4")

    assert queue.store.base.layouts() == set()  # type: ignore[attr-defined]
    assert sorted(parts(queue.store)) == sorted(layout_names(2))


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("0", "a layout is 1 to 128, not 0"),
        ("129", "a layout is 1 to 128, not 129"),
        ("four", "'four' is not a whole number"),
    ],
)
def test_retire_names_what_is_wrong_with_the_layout_given(given: str, said: str) -> None:
    with pytest.raises(CommandError, match=f"argument --retire: {said}$"):
        call_command("delayqueue_shards", "default", "--retire", given)


def test_a_retired_layout_still_in_use_is_registered_again_by_its_sender(
    settings: Any, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_layouts, "LAYOUT_REGISTER_SECONDS", 0.0)
    old = with_shards(settings, url, 4)
    # (Twenty: some land on shards other than shard 0, which every layout shares.)
    old.send_many([{"n": n} for n in range(20)])
    old.store.base.retire_layout(4)  # type: ignore[attr-defined]  # as a hasty operator would

    old.send_many([{"n": n} for n in range(20)])

    assert old.store.base.layouts() == {4}  # type: ignore[attr-defined]


def test_the_shards_command_shows_live_and_draining_shards(
    settings: Any, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_shards(settings, url, 3).send_many([{"n": n} for n in range(30)])
    with_shards(settings, url, 2)

    call_command("delayqueue_shards", "default")

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "queue default: SHARDS 2 (live); draining: 3"
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert sorted(rows) == ["0", "2.1", "3.1", "3.2"]
    assert rows["2.1"][1] == "live"
    assert rows["3.1"][1] == "draining"
    # The pending column adds up to what was sent (layout 2's shard holds none yet).
    assert sum(int(row[3]) for row in rows.values()) == 30
    assert rows["2.1"][3] == "0"


def test_the_shards_command_shows_the_shards_that_answer_while_others_are_down(
    shards_down: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # As the other readers do: a master down hides only its shards, then exit 1.
    with pytest.raises(CommandError, match=r"Redis cannot be reached for shard\(s\) ") as caught:
        call_command("delayqueue_shards", "default")
    assert caught.value.returncode == 1
    assert ", ".join(shards_down) in str(caught.value)
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert len(rows) == 6
    for name, row in rows.items():
        if name in shards_down:
            assert (row.split()[1], row.split()[3]) == ("live", "unreachable:"), row
        else:
            assert row.split()[3:9] == ["0"] * 6, row


def test_a_wakeup_subscription_follows_the_shards_fetched_from(settings: Any, url: str) -> None:
    """A worker's wake-ups: once its store drains another layout, the subscription covers
    that layout's shards too, and has the consumer look at once (what was published
    before it did went unheard)."""
    queue = with_shards(settings, url, 2)
    store = queue.store
    assert isinstance(store, ShardedStore)
    subscription = store.subscribe_wakeups()
    try:
        # Registers layout 4 (some of the twenty land on its shards other than shard 0).
        with_shards(settings, url, 4).send_many([{"n": n} for n in range(20)], delay=30)
        store.refresh_layouts(force=True)

        assert subscription.wait(timeout=1.0) == 0

        heard = set(subscription._names.values())
        assert heard == set(layout_names(2)) | set(layout_names(4))
    finally:
        subscription.close()


@pytest.mark.timeout(120)
def test_workers_reshard_a_cluster_queue_from_4_to_8_to_2_under_load(
    settings: Any, redis_cluster: RedisClusterServers
) -> None:
    """Rolling deploys of each new SHARDS on the 3-master cluster: a worker of the new
    layout starts, the sender moves to it, the old worker stops (SIGTERM), while messages
    keep coming due. Every message is handled once, and the earlier layouts retire."""
    redis_cluster.flush()
    started: list[WorkerProcess] = []
    sent: list[str] = []
    try:
        previous = None
        for shards in (4, 8, 2):
            worker = WorkerProcess(redis_cluster.url, DQ_TEST_SHARDS=str(shards))
            started.append(worker)
            worker.wait_for_line("queue 'default'")
            queue = with_shards(settings, redis_cluster.url, shards)
            for batch in range(10):
                sent += queue.send_many([{"n": n} for n in range(20)], delay=0.1 * batch)
            if previous is not None:
                previous.signal(signal.SIGTERM)
                assert previous.wait(timeout=30) == 0
            previous = worker

        wait_for(
            lambda: len(events("done")) >= len(sent),
            timeout=60,
            what=f"{len(sent)} messages handled",
        )
        handled = Counter(entry["id"] for entry in events("done"))
        assert handled == Counter(sent)
        assert {shard_of(message_id)[0] for message_id in sent} == {1, 2, 4, 8}

        for layout in ("4", "8"):
            call_command("delayqueue_shards", "default", "--retire", layout)
        assert parts(queue.store).keys() == set(layout_names(2))
        assert queue.check_invariants().ok
    finally:
        for worker in started:
            worker.stop()


@pytest.mark.usefixtures("fresh_layouts")
def test_a_relay_registers_the_layout_its_rows_name_not_its_own(settings: Any, url: str) -> None:
    """An outbox row placed by a process of 8 shards, relayed by a worker still on 4: the
    message goes to its shard of layout 8, which the relay puts on the register, so the
    workers of 4 drain it rather than leave it to a worker of 8 that may not exist yet."""
    placed = with_shards(settings, url, 8).store.place(["relayed-row"] * 20)
    row = next(message_id for message_id in placed if shard_of(message_id)[1] != 0)
    relay = with_shards(settings, url, 4)

    relay.store.relay([NewMessage(row, '"x"', 0, at_ms=0)], forget=[], keep_ms=60_000)

    assert relay.store.base.layouts() == {8}  # type: ignore[attr-defined]
    assert [message.id for message in relay.fetch(10).messages] == [row]


def test_a_layout_new_on_the_register_is_announced_and_read_at_once(
    settings: Any, url: str
) -> None:
    """Without waiting LAYOUTS_RECHECK_SECONDS: the first write to a new layout publishes
    LAYOUTS_CHANGED on shard 0's channel, and a listening store reads the register at once,
    subscribes to the new shards and has its consumer look."""
    queue = with_shards(settings, url, 2)
    store = queue.store
    assert isinstance(store, ShardedStore)
    queue.fetch(10)  # the register read: nothing to drain
    subscription = store.subscribe_wakeups()
    try:
        with_shards(settings, url, 4).send_many([{"n": n} for n in range(20)], delay=30)
        heard = []
        while (due := subscription.wait(timeout=0.5)) is not None:
            heard.append(due)

        assert heard[-1] == 0  # the look at once that follows a new list of shards
        assert LAYOUTS_CHANGED not in heard  # (read by the subscription, not told)
        assert store.draining() == (4,)
        assert set(subscription._names.values()) == set(layout_names(2)) | set(layout_names(4))
    finally:
        subscription.close()


def test_a_layout_registered_before_a_subscription_took_effect_is_read_at_once(
    settings: Any, url: str
) -> None:
    """Regression: a subscription read the register before it took effect (if at all: not
    within 10 s of the last read), so a layout announced in between was heard by no one.
    At a worker's start, its relay writing outbox rows another layout placed does just
    that: the worker found the new layout at a fetch 10 s after its last read of the
    register, after its idle recheck (up to 30 s) - and the rows waited that long."""
    queue = with_shards(settings, url, 2)
    store = queue.store
    assert isinstance(store, ShardedStore)
    queue.fetch(10)  # the worker's first fetch: the register read, nothing to drain
    # Registers layout 4 and announces it, to no one listening yet.
    with_shards(settings, url, 4).send_many([{"n": n} for n in range(20)], delay=30)
    subscription = store.subscribe_wakeups()
    try:
        assert subscription.wait(timeout=1.0) == 0  # the look at once at a new list of shards
        assert store.draining() == (4,)
        assert set(subscription._names.values()) == set(layout_names(2)) | set(layout_names(4))
    finally:
        subscription.close()


def test_a_layout_is_registered_and_announced_in_one_call(
    settings: Any, redis_server: RedisServer
) -> None:
    """The register's SADD and the announcement's PUBLISH, both on shard 0, are one call:
    a process dying between two calls would have registered the layout unannounced, for
    the workers to find only at their next reading of the register."""
    queue = with_shards(settings, redis_server.url, 2)
    base = sharded(queue).base
    base.stats()  # the version check and the library's load, before the counting
    client: Any = redis_server.client()  # (redis-py's pubsub and monitor are untyped)
    marker = redis_server.client()
    marker.echo("connected")  # its connection's handshake before the counting too
    listener = client.pubsub()
    listener.subscribe(base.keys.wakeup_channel)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    with client.monitor() as monitor:
        base.add_layout(4)
        base.add_layout(4)  # on the register already: nothing to announce
        marker.echo("done")
        seen = []
        while (command := monitor.next_command())["command"] != "ECHO done":
            seen.append((command["client_type"], command["command"].split()[0]))

    assert [name for kind, name in seen if kind != "lua"] == ["FCALL", "FCALL"], seen
    # (Each reads the flow state on the way, which the layout's shards take: none here; and
    # the first on an empty register asks whether the queue has had keys: none here.)
    assert [name for kind, name in seen if kind == "lua"] == [
        "SADD",
        "SCARD",
        "EXISTS",
        "PUBLISH",
        "TYPE",
        "SADD",
        "TYPE",
    ], seen
    assert base.layouts() == {4}
    heard = listener.get_message(timeout=5)
    assert heard is not None
    assert int(heard["data"]) == LAYOUTS_CHANGED
    assert listener.get_message(timeout=0.2) is None
    listener.close()


def test_a_slow_register_read_does_not_undo_a_newer_one(settings: Any, monkeypatch: Any) -> None:
    """Two threads read the register (the listener on LAYOUTS_CHANGED, the fetch loop when
    its recheck is due). The one that read first, before layout 4 was registered, must not
    follow its older reading after the other followed the newer one: layout 4's shards
    would be left out of the fetches (and the subscription) until the next recheck."""
    queue = sharded_queue(settings, MEMORY_URL, 2)
    store = sharded(queue)
    store.refresh_layouts(force=True)
    real = store.base.layouts
    slow = threading.Event()

    def layouts() -> set[int]:
        read = real()
        if threading.current_thread().name == "slow-reader":
            slow.set()
            time.sleep(0.3)  # read, not yet followed
        return read

    monkeypatch.setattr(store.base, "layouts", layouts)
    reader = threading.Thread(target=lambda: store.refresh_layouts(force=True), name="slow-reader")
    reader.start()
    assert slow.wait(5)
    store.base.add_layout(4)  # a sender of SHARDS 4 registers its layout
    store.refresh_layouts(force=True)
    assert "4.1" in store._order
    reader.join()
    assert "4.1" in store._order, store._order


def test_a_layout_retired_during_an_exhaustion_claim_does_not_fail_it(settings: Any) -> None:
    """claim_exhausted reads the shards' plans again after each shard's round trip; a
    layout retired meanwhile (by another thread's reading of the register) took its
    shards' plans away."""
    queue = sharded_queue(settings, MEMORY_URL, 1)
    store = sharded(queue)
    store.base.add_layout(2)
    store.refresh_layouts(force=True)
    assert store._order == ["0", "2.1"]
    draining = store._store("2.1")
    real = draining.claim_exhausted

    def claim_then_retire(count: int, claim_ms: int) -> list[Any]:
        claims = real(count, claim_ms)
        assert store.retire(2) == {}  # empty: retired, and the register read again
        return claims

    draining.claim_exhausted = claim_then_retire  # type: ignore[method-assign]

    assert store.claim_exhausted(10, 1000) == []


@pytest.mark.usefixtures("fresh_layouts")
def test_a_relay_registers_again_a_layout_retired_since_it_last_wrote_there(
    settings: Any, url: str
) -> None:
    """Rows of layout 8 relayed by a worker of 4: the first registered layout 8, whose
    shards then drained and were retired; the next row must put it back on the register
    at once, or its message waits on a shard no worker fetches (until the relay happens to
    write to that layout again, LAYOUT_REGISTER_SECONDS on: perhaps never)."""
    placed = with_shards(settings, url, 8).store.place([f"row-{n}" for n in range(40)])
    first, second = [message_id for message_id in placed if shard_of(message_id)[1] != 0][:2]
    queue = with_shards(settings, url, 4)
    queue.store.relay([NewMessage(first, '"x"', 0, at_ms=0)], forget=[], keep_ms=60_000)
    assert drain(queue, 1) == Counter([first])
    # Drained: an operator retires it (the relay's process reads the register meanwhile).
    assert queue.store.retire(8) == {}  # type: ignore[attr-defined]

    queue.store.relay([NewMessage(second, '"y"', 0, at_ms=0)], forget=[], keep_ms=60_000)

    assert queue.store.base.layouts() == {8}  # type: ignore[attr-defined]
    assert drain(queue, 1, timeout=2) == Counter([second])


def test_retire_refuses_a_layout_whose_outbox_rows_wait_to_be_relayed(
    settings: Any, database: str, redis_server: RedisServer
) -> None:
    """Rows sent through the outbox by processes of 8 shards, committed and not relayed
    yet when the operator retires layout 8 (its shards empty): each names a shard of 8, and
    a relay that registered layout 8 lately would write it there unregistered, where no
    worker fetches. The command counts them as it counts the shards' messages."""
    redis_server.client().flushall()
    old = with_shards(settings, redis_server.url, 8)
    old.send_many([{"n": n} for n in range(20)])
    with transaction.atomic(using=database):
        waiting = old.send_many([{"n": n} for n in range(20)], outbox=True, using=database)
    assert any(shard_of(message_id)[0] == 8 for message_id in waiting)
    queue = with_shards(settings, redis_server.url, 4)
    assert sum(drain(queue, 20).values()) == 20

    with pytest.raises(CommandError, match=r"layout 8 still has \d+ outbox row\(s\) waiting"):
        call_command("delayqueue_shards", "default", "--retire", "8")
    assert queue.store.base.layouts() == {8}  # type: ignore[attr-defined]

    assert OutboxRelay([queue], databases=[database]).drain() == 20
    assert drain(queue, 20) == Counter(waiting)
    call_command("delayqueue_shards", "default", "--retire", "8")
    assert 8 not in queue.store.base.layouts()  # type: ignore[attr-defined]
