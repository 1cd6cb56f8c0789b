"""Checking one queue's state in Redis against the rules every script keeps.

The rules: every message id is in exactly one state (pending, ready, unack, retry, garbage),
once; every live message has a payload and a readable meta record whose attempt count fits
its state, and its id and payload are UTF-8 text; no payload, meta record or attempt
records outlive their message; an exhaustion still to announce belongs to a dead letter;
and for keyed messages, every waiting one is its key's message in the key index (so no
two wait with one key), and the index names no message that is gone (the scripts drop a
key with its message: one left behind is a leak, though harmless to sends and lookups,
which find nothing waiting).
Dead letters without a readable payload or meta record are the engine's own way of setting
damage aside, so they are counted (``damaged``), not reported as problems; and so are the
keys renamed aside for holding the wrong type (``quarantined``).

The state is read in one atomic snapshot by a read-only Lua script (snapshot.lua) that returns
every id; the checking runs here, off the server. A MULTI/EXEC of the same range reads would
keep Redis busy for about half as long, but Redis refuses to queue any command in MULTI while
it is out of memory, which is when an operator most needs the check; a read-only script runs
then, on a read-only replica too, and on Redis Cluster it goes where the queue's hash tag
lives like every other script. The cost is O(n) for n messages: Redis is busy for the read
(measured: about 0.4 s per 100,000 messages, 5 s and some 110 MB of Lua memory for a
million), so on a very large queue run it when such a pause is acceptable. Whether each
payload is UTF-8 text is read afterwards, a page at a time (``Store.unreadable_payloads``),
which does not hold Redis up but carries every payload across the network once: the snapshot
would have to hold them all, and a payload never changes while its message lives.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.engine.protocol import ShardStore, Store
from delayqueue_django.engine.records import STATES, meta_numbers
from delayqueue_django.engine.sharding.placement import shard_name, shard_of
from delayqueue_django.engine.sharding.store import parts


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule. ``kind`` is a stable identifier; ``subject`` a message id or a key."""

    kind: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


@dataclass(frozen=True)
class InvariantReport:
    queue: str
    # Distinct ids per state, as the snapshot found them.
    counts: dict[str, int]
    # Distinct ids the queue knows (in a state, or only in the payload or meta hash).
    messages: int
    # Dead letters without a readable payload or meta record: damage set aside.
    damaged: int
    # The keys renamed aside for holding the wrong type (see the quarantine key).
    quarantined: list[str]
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Snapshot:
    """The queue's ids as snapshot.lua read them; a key of the wrong type reads as None."""

    states: dict[str, list[str] | None]
    payload_ids: list[str] | None
    metas: dict[str, str] | None
    exhausted: list[str] | None
    quarantined: list[str]
    # Ids that are not UTF-8 text (only a foreign write stores such), as _text shows them.
    unreadable_ids: set[str] = field(default_factory=set)
    # Ids whose payload is not UTF-8 text (read apart from the snapshot, see above).
    unreadable_payloads: list[str] = field(default_factory=list)
    # The key index (key -> id), and the key of every stored keyed message (id -> key).
    key_index: dict[str, str] = field(default_factory=dict)
    message_keys: dict[str, str] = field(default_factory=dict)
    # The ids that have attempt records.
    history_ids: list[str] = field(default_factory=list)


def _text(value: bytes | str) -> str:
    """Ids and records as read: bytes that are not UTF-8 as backslash escapes, which keeps
    them apart and printable (reports are written to terminals)."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def parse_snapshot(reply: Sequence[Any], keys: QueueKeys) -> Snapshot:
    """snapshot.lua's reply as a Snapshot. (A reply without the two lists of keys, as a
    store without keys gives, reads as a queue that never used them.)"""
    state_ids = reply[: len(STATES)]
    payload_ids, flat_metas, exhausted, quarantined, foreign = reply[len(STATES) : len(STATES) + 5]
    rest = reply[len(STATES) + 5 : -1]
    flat_index, flat_keys = rest[:2] or ([], [])
    history_ids = rest[2] if len(rest) > 2 else []
    foreign_keys = {_text(key) for key in foreign}
    unreadable_ids: set[str] = set()

    def message_id(raw: bytes | str) -> str:
        try:
            return raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            shown = _text(raw)
            unreadable_ids.add(shown)
            return shown

    def ids(name: str, items: Sequence[Any]) -> list[str] | None:
        return None if keys.key(name) in foreign_keys else [message_id(item) for item in items]

    metas = None
    if keys.key("meta") not in foreign_keys:
        pairs = zip(flat_metas[::2], flat_metas[1::2], strict=True)
        metas = {message_id(raw_id): _text(raw_meta) for raw_id, raw_meta in pairs}
    return Snapshot(
        states={state: ids(state, items) for state, items in zip(STATES, state_ids, strict=True)},
        payload_ids=ids("payload", payload_ids),
        metas=metas,
        exhausted=ids("exhausted", exhausted),
        quarantined=[_text(name) for name in quarantined],
        unreadable_ids=unreadable_ids,
        key_index=_pairs(flat_index),
        message_keys=_pairs(flat_keys),
        history_ids=[message_id(raw) for raw in history_ids],
    )


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(name): _text(value) for name, value in zip(flat[::2], flat[1::2], strict=True)}


def parse_meta(raw: str) -> tuple[int, int, int] | None:
    """lease, attempt and budget: the leading fields of a meta record, which must be numbers
    the scripts can read, as must due, the fourth (later fields, added by newer versions, are
    ignored)."""
    parts = raw.split(":")
    numbers = meta_numbers(parts[:4]) if len(parts) >= 3 else None
    if numbers is None:
        return None
    return numbers[0], numbers[1], numbers[2]


def _attempt_fits(state: str, attempt: int, budget: int) -> bool:
    """What the scripts guarantee about a message's attempt count in each state."""
    if state == "ready":  # only first deliveries are staged there
        return attempt == 0
    if state == "retry":  # redeliveries with a retry left
        return 1 <= attempt <= budget
    if state == "pending":  # new (0) or waiting for a retry
        return attempt <= budget
    if state == "unack":  # the delivery counted, the last allowed one at most
        return 1 <= attempt <= budget + 1
    return True  # garbage: buried at any attempt, or set aside as damaged


def check(snapshot: Snapshot, keys: QueueKeys) -> InvariantReport:
    problems: list[Problem] = []
    where: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for state, ids in snapshot.states.items():
        if ids is None:
            problems.append(Problem("wrong-type", keys.key(state), f"the {state} key's type"))
            ids = []
        counts[state] = len(set(ids))
        for message_id in ids:
            where.setdefault(message_id, []).append(state)
    for name, value in (
        ("payload", snapshot.payload_ids),
        ("meta", snapshot.metas),
        ("exhausted", snapshot.exhausted),
    ):
        if value is None:
            problems.append(Problem("wrong-type", keys.key(name), f"the {name} key's type"))
    payloads = set(snapshot.payload_ids or ())
    metas = snapshot.metas or {}
    unreadable_payloads = set(snapshot.unreadable_payloads)

    damaged = 0
    for message_id, states in where.items():
        if len(states) > 1:
            found = ", ".join(f"{s} x{n}" for s, n in sorted(Counter(states).items()))
            problems.append(Problem("several-states", message_id, f"found in {found}"))
            continue  # the rules of one state would only repeat the news
        state = states[0]
        raw_meta = metas.get(message_id)
        if state == "garbage":
            readable = (
                message_id in payloads
                and message_id not in unreadable_payloads
                and message_id not in snapshot.unreadable_ids
            )
            if not readable or raw_meta is None or parse_meta(raw_meta) is None:
                damaged += 1
            continue
        if message_id in snapshot.unreadable_ids:
            problems.append(Problem("unreadable-id", message_id, f"{state}, id not UTF-8"))
        if message_id not in payloads:
            problems.append(Problem("no-payload", message_id, f"{state} without a payload"))
        elif message_id in unreadable_payloads:
            problems.append(
                Problem("unreadable-payload", message_id, f"{state} with a payload not UTF-8")
            )
        if raw_meta is None:
            # A message never handed out keeps its first meta record in its payload (see
            # snapshot.lua): with the payload missing (named above), nothing else is.
            if state not in ("pending", "ready") or message_id in payloads:
                problems.append(Problem("no-meta", message_id, f"{state} without a meta record"))
            continue
        parsed = parse_meta(raw_meta)
        if parsed is None:
            problems.append(Problem("bad-meta", message_id, f"unreadable meta {raw_meta!r}"))
        elif not _attempt_fits(state, parsed[1], parsed[2]):
            problems.append(
                Problem(
                    "wrong-attempt",
                    message_id,
                    f"attempt {parsed[1]} with budget {parsed[2]} cannot be {state}",
                )
            )

    problems += _key_problems(snapshot, where)
    problems += _orphans("orphan-payload", "a payload", payloads, where)
    problems += _orphans("orphan-meta", "a meta record", metas, where)
    problems += _orphans("orphan-history", "attempt records", snapshot.history_ids, where)
    for message_id in snapshot.exhausted or ():
        if "garbage" not in where.get(message_id, ()):
            problems.append(
                Problem("unannounced-not-dead", message_id, "exhaustion owed for no dead letter")
            )
    known = set(where) | payloads | set(metas)
    return InvariantReport(
        queue=keys.queue,
        counts=counts,
        messages=len(known),
        damaged=damaged,
        quarantined=snapshot.quarantined,
        problems=problems,
    )


def _key_problems(snapshot: Snapshot, where: dict[str, list[str]]) -> list[Problem]:
    """Every waiting keyed message is its key's (so no two wait with one key); every key
    names a stored message that has that key."""
    problems = []
    waiting: dict[str, list[str]] = {}
    for message_id, key in sorted(snapshot.message_keys.items()):
        states = where.get(message_id, [])
        if len(states) == 1 and states[0] in ("pending", "ready", "retry"):
            waiting.setdefault(key, []).append(message_id)
            named = snapshot.key_index.get(key)
            if named != message_id:
                detail = f"waits with key {key!r}, which names {named or 'nothing'}"
                problems.append(Problem("key-not-indexed", message_id, detail))
    for key, ids in sorted(waiting.items()):
        if len(ids) > 1:
            problems.append(Problem("key-waiting-twice", key, f"waiting: {', '.join(ids)}"))
    for key, message_id in sorted(snapshot.key_index.items()):
        if snapshot.message_keys.get(message_id) != key:
            problems.append(
                Problem("key-stale", key, f"names {message_id}, not stored with this key")
            )
    return problems


def _orphans(
    kind: str, what: str, ids: Sequence[str] | set[str] | dict[str, str], where: dict[str, Any]
) -> list[Problem]:
    return [
        Problem(kind, message_id, f"{what} for a message in no state")
        for message_id in sorted(ids)
        if message_id not in where
    ]


def check_queue(store: Store) -> InvariantReport:
    """Snapshot the queue atomically (one round trip; a sharded queue, shard by shard, each
    atomically), read which payloads are not text, and check it."""
    shards = parts(store)
    if len(shards) == 1:
        return check(_snapshot(shards["0"]), store.keys)
    return combined([check_shard(name, shard) for name, shard in shards.items()])


def check_shard(name: str, store: ShardStore) -> InvariantReport:
    """One shard of a sharded queue, snapshot atomically: the rules within it, and no
    message in it whose id names another shard."""
    snapshot = _snapshot(store)
    report = check(snapshot, store.keys)
    return replace(report, problems=report.problems + _misplaced(snapshot, name))


def _snapshot(store: ShardStore) -> Snapshot:
    snapshot = parse_snapshot(store.snapshot(), store.keys)
    if snapshot.payload_ids is not None:  # (a payload key of the wrong type is reported)
        unreadable = [_text(message_id) for message_id in store.unreadable_payloads()]
        snapshot = replace(snapshot, unreadable_payloads=unreadable)
    return snapshot


def _misplaced(snapshot: Snapshot, name: str) -> list[Problem]:
    """A message in a shard other than the one its id names: no one would find it there."""
    problems = []
    for ids in snapshot.states.values():
        for message_id in sorted(set(ids or ())):
            named = shard_name(*shard_of(message_id))
            if named != name:
                problems.append(
                    Problem("wrong-shard", message_id, f"in shard {name}; its id names {named}")
                )
    return problems


def combined(reports: Sequence[InvariantReport]) -> InvariantReport:
    """One report for a queue from its shards' (check_shard)."""
    counts: Counter[str] = Counter()
    for report in reports:
        counts.update(report.counts)
    return InvariantReport(
        queue=reports[0].queue,
        counts={state: counts[state] for state in STATES},
        messages=sum(report.messages for report in reports),
        damaged=sum(report.damaged for report in reports),
        quarantined=[name for report in reports for name in report.quarantined],
        problems=[problem for report in reports for problem in report.problems],
    )
