"""``ScoredSet``: a Redis sorted set in memory, for the memory store.

Ids are ordered by score, then by id, as Redis orders a zset's members. A binary heap gives
the head and the due prefix cheaply; removals and re-scorings are lazy (the heap keeps stale
entries, which are skipped and, once they outnumber the live ones, swept out), so every
operation the store needs costs O(log n) per id it touches, not O(n).
"""

import heapq
from collections.abc import Iterator

# (score, id, version): an entry is live while its id still maps to that version.
_Entry = tuple[int, str, int]

# Below this many stale entries the heap is never rebuilt: not worth it.
_SWEEP_FLOOR = 1024


class ScoredSet:
    def __init__(self) -> None:
        self._live: dict[str, tuple[int, int]] = {}  # id -> (score, version)
        self._heap: list[_Entry] = []
        self._version = 0
        self._stale = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, member: object) -> bool:
        return member in self._live

    def score(self, member: str) -> int | None:
        found = self._live.get(member)
        return None if found is None else found[0]

    def add(self, member: str, score: int) -> None:
        """Insert, or move to a new score (ZADD)."""
        if member in self._live:
            if self._live[member][0] == score:
                return
            self._stale += 1
        self._version += 1
        self._live[member] = (score, self._version)
        heapq.heappush(self._heap, (score, member, self._version))
        self._sweep_if_worth_it()

    def remove(self, member: str) -> bool:
        """ZREM: True if the member was there."""
        if self._live.pop(member, None) is None:
            return False
        self._stale += 1
        self._sweep_if_worth_it()
        return True

    def head(self) -> tuple[str, int] | None:
        """The member with the lowest score, and that score."""
        self._drop_stale_head()
        if not self._heap:
            return None
        score, member, _ = self._heap[0]
        return member, score

    def pop_upto(self, max_score: int, limit: int) -> list[tuple[str, int]]:
        """Remove and return up to ``limit`` members scored at most ``max_score``, lowest first."""
        popped: list[tuple[str, int]] = []
        while len(popped) < limit:
            self._drop_stale_head()
            if not self._heap or self._heap[0][0] > max_score:
                break
            score, member, _ = heapq.heappop(self._heap)
            del self._live[member]
            popped.append((member, score))
        return popped

    def upto(self, max_score: int, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` members scored at most ``max_score``, lowest first (ZRANGE BYSCORE
        LIMIT); nothing is removed."""
        found: list[tuple[str, int]] = []
        if limit <= 0:
            return found
        for member, score in self.ordered():
            if score > max_score:
                break
            found.append((member, score))
            if len(found) == limit:
                break
        return found

    def count_upto(self, max_score: int) -> int:
        """How many members are scored at most ``max_score`` (ZCOUNT -inf max)."""
        count = 0
        for _, score in self.ordered():
            if score > max_score:
                break
            count += 1
        return count

    def page(self, offset: int, limit: int) -> list[tuple[str, int]]:
        """Members ``offset`` to ``offset + limit - 1`` in order (ZRANGE by rank)."""
        found: list[tuple[str, int]] = []
        if limit <= 0:
            return found
        for rank, entry in enumerate(self.ordered()):
            if rank >= offset:
                found.append(entry)
                if len(found) == limit:
                    break
        return found

    def ordered(self) -> Iterator[tuple[str, int]]:
        """Live members in order, lazily: a walk of the heap that costs O(log n) per member
        yielded. The set must not change while the walk is under way."""
        heap = self._heap
        if not heap:
            return
        frontier: list[tuple[_Entry, int]] = [(heap[0], 0)]
        while frontier:
            (score, member, version), index = heapq.heappop(frontier)
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
            if self._live.get(member) == (score, version):
                yield member, score

    def _drop_stale_head(self) -> None:
        heap = self._heap
        while heap and self._live.get(heap[0][1]) != (heap[0][0], heap[0][2]):
            heapq.heappop(heap)
            self._stale -= 1

    def _sweep_if_worth_it(self) -> None:
        if self._stale > _SWEEP_FLOOR and self._stale > len(self._live):
            self._heap = [
                (score, member, version) for member, (score, version) in self._live.items()
            ]
            heapq.heapify(self._heap)
            self._stale = 0
