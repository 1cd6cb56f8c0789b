"""What a memory queue keeps beside its messages: the register of layouts (add_layout.lua),
task results and worker heartbeats, which expire on its clock as Redis keys do."""

from collections.abc import Mapping

from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.memory.base import MemoryStoreBase
from delayqueue_django.engine.sharding.placement import LAYOUTS_CHANGED


class MemoryBookkeeping(MemoryStoreBase):
    """The register of layouts, task results and heartbeats."""

    def layouts(self) -> set[int]:
        with self.server.lock:
            return set(self._state().layouts)

    def add_layout(self, layout: int) -> tuple[bool, FlowState]:
        with self.server.lock:
            state = self._state()
            added = layout not in state.layouts
            if added:
                # The first layout of a queue that has had keys brings layout 1 with it
                # (add_layout.lua says why).
                if layout != 1 and not state.layouts and state.keys_used:
                    state.layouts.add(1)
                state.layouts.add(layout)
                self._wake(LAYOUTS_CHANGED)
            return added, FlowState(state.paused, state.queue_rate)

    def retire_layout(self, layout: int) -> bool:
        with self.server.lock:
            layouts = self._state().layouts
            registered = layout in layouts
            layouts.discard(layout)
            return registered

    # Task results (delayqueue_django.tasks)

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        with self.server.lock:
            now = self._now()
            record = {**self._live_result(result_id, now), **fields}
            for name, value in unless_set.items():
                record.setdefault(name, value)
            expires = None if ttl_seconds is None else now + ttl_seconds * 1000
            self._state().results[result_id] = (record, expires)
            return dict(record)

    def read_result(self, result_id: str) -> dict[str, str]:
        with self.server.lock:
            return dict(self._live_result(result_id, self._now()))

    def _live_result(self, result_id: str, now: int) -> dict[str, str]:
        results = self._state().results
        record, expires = results.get(result_id, ({}, None))
        if expires is not None and expires <= now:
            del results[result_id]
            return {}
        return record

    # Worker heartbeats

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        with self.server.lock:
            expires = self._now() + max(ttl_ms, 1)
            self._state().heartbeats[worker_id] = (details, expires)

    def drop_heartbeat(self, worker_id: str) -> None:
        with self.server.lock:
            self._state().heartbeats.pop(worker_id, None)

    def heartbeats(self) -> dict[str, str]:
        with self.server.lock:
            beats, now = self._state().heartbeats, self._now()
            for worker_id in [w for w, (_, expires) in beats.items() if expires <= now]:
                del beats[worker_id]
            return {worker_id: details for worker_id, (details, _) in beats.items()}
