"""The records a ``RedisStore`` keeps beside the queue with plain commands, no script: task
results (delayqueue_django.tasks) and worker heartbeats."""

from collections.abc import Mapping
from typing import Any

from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.replies import _id, _shown, _text_dict


class RedisSideRecords(RedisStoreBase):
    """Task results and worker heartbeats."""

    # Task results (delayqueue_django.tasks): a hash per result, beside the queue's keys,
    # living ttl_seconds after its last change (or until deleted, with None).

    def write_result(
        self,
        result_id: str,
        fields: Mapping[str, str],
        *,
        unless_set: Mapping[str, str],
        ttl_seconds: int | None,
    ) -> dict[str, str]:
        key = self.keys.key(f"task:{result_id}")
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping=dict(fields))
        for name, value in unless_set.items():
            pipe.hsetnx(key, name, value)
        if ttl_seconds is None:
            pipe.persist(key)
        else:
            pipe.expire(key, ttl_seconds)
        pipe.hgetall(key)
        return _text_dict(pipe.execute()[-1])

    def read_result(self, result_id: str) -> dict[str, str]:
        client: Any = self.client
        return _text_dict(client.hgetall(self.keys.key(f"task:{result_id}")))

    # Worker heartbeats: a key per worker, expiring on its own, and an index set of their
    # ids that readers prune of the expired ones.

    def put_heartbeat(self, worker_id: str, details: str, ttl_ms: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.key(f"worker:{worker_id}"), details, px=max(ttl_ms, 1))
        pipe.sadd(self.keys.key("workers"), worker_id)
        pipe.execute()

    def drop_heartbeat(self, worker_id: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.key(f"worker:{worker_id}"))
        pipe.srem(self.keys.key("workers"), worker_id)
        pipe.execute()

    def heartbeats(self) -> dict[str, str]:
        client: Any = self.client  # redis-py types smembers/mget loosely
        index = self.keys.key("workers")
        ids = sorted(_id(member) for member in client.smembers(index))
        if not ids:
            return {}
        keys = [wire(self.keys.key(f"worker:{worker_id}")) for worker_id in ids]
        live = {
            worker_id: _shown(value)
            for worker_id, value in zip(ids, client.mget(keys), strict=True)
            if value is not None
        }
        gone = [wire(worker_id) for worker_id in ids if worker_id not in live]
        if gone:
            client.srem(index, *gone)
        return live
