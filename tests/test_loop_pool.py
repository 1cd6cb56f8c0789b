"""The worker's event loop (worker.loop_pool.LoopPool) on its own: what it tells the
consumers as its tasks finish."""

import asyncio
import threading
import time

from delayqueue_django.core.message import Message
from delayqueue_django.worker.handling import Outcome, Verdict
from delayqueue_django.worker.loop_pool import LoopPool


class Gate:
    """A consumer whose handlers all wait for one future, opened from the test's thread:
    they then finish in the same turn of the loop, as a batch of handlers awaiting the same
    I/O does."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.opened: asyncio.Future[None] = loop.create_future()
        self.reported: list[Outcome] = []
        self.all_reported = threading.Event()
        self.expected = 0

    def is_stale(self, fetched_at: float) -> bool:
        return False

    def handle(self, message: Message, *, back_to_back: bool = False) -> Outcome:
        raise AssertionError("a sync handler's call, on the loop")

    async def ahandle(self, message: Message) -> Outcome:
        await self.opened
        return Outcome(message, Verdict.ACK)

    def report(self, outcome: Outcome) -> None:
        self.reported.append(outcome)
        if len(self.reported) == self.expected:
            self.all_reported.set()

    def redis_now_ms(self) -> float:
        return time.time() * 1000

    def open(self) -> None:
        self.loop.call_soon_threadsafe(self.opened.set_result, None)


def message(n: int) -> Message:
    return Message(
        id=f"m{n}",
        queue="default",
        payload={"n": n},
        attempt=1,
        retry_count=0,
        lease=1,
        deadline_ms=2**50,
        due_ms=1,
    )


def test_tasks_finishing_in_one_turn_of_the_loop_tell_the_consumers_once() -> None:
    # Each look at a consumer's room reads every running task (ConsumerPool._room): told
    # once per finished task, a thousand in flight cost a million reads per thousand.
    told = []
    pool = LoopPool(200, on_room_freed=lambda: told.append(time.monotonic()))
    pool.start()
    try:
        gate = Gate(pool.loop)
        gate.expected = 200
        pool.submit(gate, [message(n) for n in range(200)])
        deadline = time.monotonic() + 5
        while len(pool.running()) < 200:
            assert time.monotonic() < deadline, "the tasks did not all start"
            time.sleep(0.01)
        gate.open()
        assert gate.all_reported.wait(5)
        deadline = time.monotonic() + 5
        while pool.outstanding() or not told:
            assert time.monotonic() < deadline, "the room freed was never told"
            time.sleep(0.01)
        assert [outcome.verdict for outcome in gate.reported] == [Verdict.ACK] * 200
        assert len(told) == 1
    finally:
        pool.close()


def test_the_running_tasks_are_listed_longest_running_first() -> None:
    pool = LoopPool(100)
    pool.start()
    try:
        gate = Gate(pool.loop)
        gate.expected = 60
        for first in (0, 20, 40):
            pool.submit(gate, [message(n) for n in range(first, first + 20)])
            deadline = time.monotonic() + 5
            while len(pool.running()) < first + 20:
                assert time.monotonic() < deadline, "the tasks did not all start"
                time.sleep(0.01)
            time.sleep(0.01)
        running = pool.running()
        assert [r.job.message.id for r in running] == [f"m{n}" for n in range(60)]
        started = [r.started_at for r in running]
        assert started == sorted(started)
        gate.open()
        assert gate.all_reported.wait(5)
    finally:
        pool.close()
