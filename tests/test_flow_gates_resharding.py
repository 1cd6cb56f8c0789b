"""A pause and a rate set at run time hold on the shards of a layout that comes after them
(issue #27): a sharded queue's shards take shard 0's flow state when their layout is
registered, and a pause, resume or rate reaches every layout on the register; the two
paths race and converge (see engine.sharding.flow)."""

from collections.abc import Callable
from typing import Any

import pytest

from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.sharding.placement import shard_of
from delayqueue_django.engine.sharding.store import parts

# (On the Cluster, a layout's shards lie on other masters than shard 0.)
pytestmark = pytest.mark.parametrize(
    "backend_url",
    ["standalone", pytest.param("cluster", marks=pytest.mark.cluster), "memory"],
    indirect=True,
)


def fetch_all(queue: Queue, rounds: int = 4) -> list[Message]:
    """What a few fetches in a row take (a sharded fetch asks some shards each)."""
    taken: list[Message] = []
    for _ in range(rounds):
        taken += queue.fetch(100).messages
    return taken


def on_shards_of(queue: Queue, count: int, layout: int) -> list[str]:
    """Send ``count`` messages; those that landed on the shards ``layout`` alone has."""
    ids = queue.send_many([{"n": n} for n in range(count)])
    return [message_id for message_id in ids if shard_of(message_id)[0] == layout]


def test_a_pause_holds_on_the_shards_of_a_layout_added_after_it(
    configure: Callable[..., Queue],
) -> None:
    before = configure(SHARDS=2)
    before.pause()
    after = configure(SHARDS=3)
    assert on_shards_of(after, 30, 3)
    assert after.stats()["paused"] == 1
    assert fetch_all(after) == []
    assert fetch_all(before) == []
    after.resume()
    assert len(fetch_all(after)) == 30


def test_a_pause_reaches_a_layout_registered_since_the_register_was_last_read(
    configure: Callable[..., Queue],
) -> None:
    pauser = configure(SHARDS=2)
    pauser.fetch(10)  # reads the register (a worker reads it every LAYOUTS_RECHECK_SECONDS)
    sender = configure(SHARDS=3)
    assert on_shards_of(sender, 30, 3)
    pauser.pause()
    assert fetch_all(sender) == []


def test_a_run_time_rate_binds_the_shards_of_a_layout_added_after_it(
    configure: Callable[..., Queue],
) -> None:
    admin = configure(SHARDS=2)
    admin.set_rate_limit("5/s")
    worker = configure(SHARDS=3, MAX_CONSUME_DURATION=60)
    assert on_shards_of(worker, 40, 3)
    # The first fetch may find the rate only on the way (a shard says so): at most one
    # fetch's worth of shards each, never more than the rate in all.
    assert len(fetch_all(worker)) == 5
    admin.set_rate_limit(None)
    assert not worker.flow().rate_limit_overridden
    assert len(fetch_all(worker)) == 35


def test_a_layout_registered_again_after_a_resume_is_not_left_paused(
    configure: Callable[..., Queue],
) -> None:
    # A process of SHARDS 3 paused the queue, its own shards with it, before its layout
    # was ever registered (it sent nothing); a process of SHARDS 2 resumed it, knowing of
    # no layout 3: those shards kept the pause.
    configure(SHARDS=3).pause()
    configure(SHARDS=2).resume()
    sender = configure(SHARDS=3)
    assert on_shards_of(sender, 30, 3)
    assert len(fetch_all(sender)) == 30


def test_a_pause_landing_between_a_registration_and_its_copy_holds(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender read shard 0's state (not paused) with its registration; another
    process pauses the queue, the new layout's shards too, before the sender copies what
    it read: the sender reads shard 0 again after its copy, and copies the pause."""
    pauser = configure(SHARDS=2)
    sender = configure(SHARDS=3)
    base = parts(sender.store)["0"]
    add_layout = base.add_layout

    def then_paused(layout: int) -> Any:
        registered = add_layout(layout)
        pauser.pause()
        return registered

    monkeypatch.setattr(base, "add_layout", then_paused)
    assert on_shards_of(sender, 30, 3)
    assert fetch_all(sender) == []
    sender.resume()
    assert len(fetch_all(sender)) == 30


def test_a_resume_landing_while_a_pause_is_copied_leaves_no_shard_paused(
    configure: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause copied to a shard after another process's resume had reached it: the
    pausing process reads shard 0 again after its copies, and copies the resume."""
    pauser = configure(SHARDS=2)
    resumer = configure(SHARDS=2)
    ids = on_shards_of(pauser, 30, 2)
    assert ids
    shard = parts(pauser.store)["2.1"]
    copy_flow = shard.copy_flow
    raced: list[FlowState] = []

    def after_a_resume(state: FlowState) -> None:
        if not raced:
            raced.append(state)
            resumer.resume()
        copy_flow(state)

    monkeypatch.setattr(shard, "copy_flow", after_a_resume)
    pauser.pause()
    assert raced == [FlowState(paused=True, rate=None)]
    assert not pauser.flow().paused
    assert len(fetch_all(pauser)) == 30
