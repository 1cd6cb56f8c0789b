"""``MemoryServer``: what a Redis server is to ``RedisStore``, for ``MemoryStore``.

It holds the state of every queue that uses it, keyed by the queue's hash tag
(``{KEY_PREFIX:name}``) as Redis keys are, one lock that makes each store operation atomic
(a ``threading.Condition``, which is also what wake-up subscribers wait on), the clock, and
the wake-up channels. Servers are named (``memory://name``; the unnamed one is ``""``) and
live as long as the process, like a Redis server outlives the settings that point at it.
"""

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from delayqueue_django.engine.memory.clock import Clock, ManualClock, SystemClock
from delayqueue_django.engine.memory.scored import ScoredSet
from delayqueue_django.engine.metrics import Counts
from delayqueue_django.engine.records import NewMessage, ScheduleFailure


@dataclass(slots=True)
class Meta:
    """The meta record ("lease:attempt:budget:due" in Redis); see _prelude.lua."""

    lease: int
    attempt: int
    budget: int
    due: int


@dataclass(slots=True)
class TickRecord:
    """Where a schedule's ticks stand ("fingerprint:paused:cursor:tick:previous:since" in
    Redis); see schedule.lua."""

    fingerprint: str
    paused: bool = False
    cursor: int = 0
    tick: int = 0
    previous: int = 0
    since: int = 0


@dataclass
class QueueState:
    """One queue's structures, named as the Redis keys they stand for."""

    pending: ScoredSet = field(default_factory=ScoredSet)
    ready: deque[str] = field(default_factory=deque)
    unack: ScoredSet = field(default_factory=ScoredSet)
    retry: deque[str] = field(default_factory=deque)
    garbage: ScoredSet = field(default_factory=ScoredSet)
    payloads: dict[str, str] = field(default_factory=dict)
    metas: dict[str, Meta] = field(default_factory=dict)
    exhausted: ScoredSet = field(default_factory=ScoredSet)
    # The metrics history ("<tag>:metrics:m:<hour>" and "<tag>:metrics:h:<day>" in Redis):
    # minute (the clock's ms // 60000) -> its counts, for the last day; hour (ms // 3600000)
    # -> its counts, rolled up from the minutes by prune_throughput, for 14 days.
    minute_records: dict[int, Counts] = field(default_factory=dict)
    hour_records: dict[int, Counts] = field(default_factory=dict)
    # Running totals since the queue began, never pruned ("all:<name>" in Redis).
    totals: dict[str, int] = field(default_factory=dict)
    # worker id -> (details JSON, expiry ms)
    heartbeats: dict[str, tuple[str, int]] = field(default_factory=dict)
    # fetcher -> its last fetch: (request, [(id, lease), ...], expiry ms); see fetch.lua.
    fetches: dict[str, tuple[str, list[tuple[str, int]], int]] = field(default_factory=dict)
    # fetcher -> the reply to its last named ack or nack request that changed something:
    # (request, reply, expiry ms); see "Lost replies" in _prelude.lua.
    commits: dict[str, tuple[str, Any, int]] = field(default_factory=dict)
    # schedule name -> definition (JSON), where its ticks stand, and why a worker could not
    # write them (ScheduleFailure).
    schedules: dict[str, str] = field(default_factory=dict)
    schedule_ticks: dict[str, TickRecord] = field(default_factory=dict)
    schedule_failures: dict[str, ScheduleFailure] = field(default_factory=dict)
    # schedule name -> when a worker last declared it in its settings (ms).
    schedule_declared: dict[str, int] = field(default_factory=dict)
    # Ids written by relay from a database outbox -> when (see relay.lua).
    relayed: ScoredSet = field(default_factory=ScoredSet)
    # The layouts registered as possibly holding messages (see engine.sharding.layouts).
    layouts: set[int] = field(default_factory=set)
    # task result id -> (record, expiry ms or None)
    results: dict[str, tuple[dict[str, str], int | None]] = field(default_factory=dict)
    # The key index ({tag}:keys): key -> id of the key's message (see memory/key_index.py),
    # and whether the queue has had a keyed message (the index's marker field "").
    keys: dict[str, str] = field(default_factory=dict)
    keys_used: bool = False
    # The outbox rows remembered per key ({tag}:key_rows, see memory/key_index.py): key ->
    # (the message they wrote, {database: the newest of its rows whose replace wrote it}).
    key_rows: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    # unique_for holds ({tag}:hold:<key>): key -> holder id, and key -> when the hold ends
    # (ms), by which the ended ones are reclaimed as Redis expires the keys.
    holders: dict[str, str] = field(default_factory=dict)
    hold_ends: ScoredSet = field(default_factory=ScoredSet)
    # The flow gates ({tag}:flow, {tag}:flow:log and {tag}:flow:slots, see memory/flow.py):
    # paused, the rate set at run time ((limit, period ms) or None) that this queue (shard
    # 0 of a sharded one) enforces and the whole queue's (a sharded queue's other shards
    # hold a copy of shard 0's paused and queue_rate, see engine.sharding.flow), the
    # hand-outs in the rate limit's window ((time, name): a reservation's entries are
    # named, a fetch's ""), oldest first, and a sharded queue's slots in flight under its
    # cap: id or entry -> deadline.
    paused: bool = False
    rate: tuple[int, int] | None = None
    queue_rate: tuple[int, int] | None = None
    handed_out: deque[tuple[int, str]] = field(default_factory=deque)
    flow_slots: ScoredSet = field(default_factory=ScoredSet)
    # Ordered groups (see memory/groups.py): id -> (send number, group), the last send
    # number, group -> id of its holder, group -> its parked (due, send number, id), sorted.
    group_of: dict[str, tuple[int, str]] = field(default_factory=dict)
    group_seq: int = 0
    group_busy: dict[str, str] = field(default_factory=dict)
    group_parked: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    # Expiry and postpones (see memory/expiry.py): id -> expiry (ms) ({tag}:expires), id ->
    # times postponed ({tag}:postpones), id -> a dead letter's reason ({tag}:dead_reason).
    expiries: dict[str, int] = field(default_factory=dict)
    postpones: dict[str, int] = field(default_factory=dict)
    dead_reasons: dict[str, str] = field(default_factory=dict)
    # Attempt records ({tag}:history, see memory/history.py): id -> its records, packed as
    # the scripts pack them (engine.history).
    history: dict[str, str] = field(default_factory=dict)
    # Outcome records (see memory/outcomes.py): id -> record ({tag}:ended:<id>), key -> id
    # ({tag}:ended_key:<key>), and when each ends ("i<id>" or "k<key>" -> ms).
    ended: dict[str, str] = field(default_factory=dict)
    ended_keys: dict[str, str] = field(default_factory=dict)
    ended_ends: ScoredSet = field(default_factory=ScoredSet)


@dataclass(frozen=True, slots=True)
class SentRecord:
    """A message as it was sent, for tests that look at what their code sent."""

    queue: str
    message: NewMessage
    due_ms: int
    sent_ms: int


class MemoryWakeups:
    """A subscription to wake-up channels (one per shard of a queue): every publication is
    queued for each subscriber, as Redis pub/sub delivers it to each."""

    def __init__(self, server: "MemoryServer", channels: Sequence[str]) -> None:
        self._server = server
        self._channels = list(channels)
        self._announced: deque[tuple[str, int]] = deque()
        for channel in self._channels:
            server.subscribe(channel, self)

    def deliver(self, channel: str, due_ms: int) -> None:
        self._announced.append((channel, due_ms))

    def wait(self, timeout: float) -> int | None:
        heard = self.wait_on(timeout)
        return None if heard is None else heard[1]

    def wait_on(self, timeout: float) -> tuple[str, int] | None:
        """``wait``, telling on which channel the wake-up came: ``(channel, due_ms)``."""
        with self._server.lock:
            if self._server.lock.wait_for(lambda: self._announced, timeout=timeout):
                return self._announced.popleft()
            return None

    def close(self) -> None:
        for channel in self._channels:
            self._server.unsubscribe(channel, self)


class MemoryServer:
    def __init__(self, name: str = "", clock: Clock | None = None) -> None:
        self.name = name
        self.clock: Clock = SystemClock() if clock is None else clock
        self.lock = threading.Condition(threading.RLock())
        self._queues: dict[str, QueueState] = {}
        self._subscribers: dict[str, list[MemoryWakeups]] = {}
        # Every send, when a test asked for them (see delayqueue_django.testing).
        self.sent: list[SentRecord] | None = None
        if isinstance(self.clock, ManualClock):
            # Time moved: work may have come due, so wake every listening worker.
            self.clock.on_advance(self._wake_everyone)

    def state(self, tag: str) -> QueueState:
        """The queue's state (created empty on first use); call with the lock held."""
        found = self._queues.get(tag)
        if found is None:
            found = self._queues[tag] = QueueState()
        return found

    def flush(self) -> None:
        """Forget every queue's messages (Redis's FLUSHALL)."""
        with self.lock:
            self._queues.clear()
            if self.sent is not None:
                self.sent.clear()

    # Wake-up channels

    def subscribe(self, channel: str, subscriber: MemoryWakeups) -> None:
        with self.lock:
            self._subscribers.setdefault(channel, []).append(subscriber)

    def unsubscribe(self, channel: str, subscriber: MemoryWakeups) -> None:
        with self.lock:
            listeners = self._subscribers.get(channel, [])
            if subscriber in listeners:
                listeners.remove(subscriber)

    def publish(self, channel: str, due_ms: int) -> None:
        with self.lock:
            for subscriber in self._subscribers.get(channel, []):
                subscriber.deliver(channel, due_ms)
            self.lock.notify_all()

    def _wake_everyone(self, now_ms: int) -> None:
        # Announced as due at 0, long past on any clock: a worker times an announced due
        # time by its estimate of the store's clock, which runs with real time, and so lags
        # behind a clock that jumped; the moved clock's own time would look an hour away.
        with self.lock:
            for channel in self._subscribers:
                self.publish(channel, 0)


_servers: dict[str, MemoryServer] = {}
_servers_lock = threading.Lock()


def get_server(name: str = "") -> MemoryServer:
    """The process's memory server of that name, created (on the system clock) if needed."""
    with _servers_lock:
        found = _servers.get(name)
        if found is None:
            found = _servers[name] = MemoryServer(name)
        return found


def add_server(server: MemoryServer) -> None:
    """Make a server of one's own (a manual clock, say) the one its name refers to."""
    with _servers_lock:
        if server.name in _servers:
            raise ValueError(f"a memory server named {server.name!r} exists already")
        _servers[server.name] = server


def remove_server(name: str) -> None:
    with _servers_lock:
        _servers.pop(name, None)


def flush_servers() -> None:
    """Forget every message of every memory server (between tests, say)."""
    with _servers_lock:
        servers = list(_servers.values())
    for server in servers:
        server.flush()
