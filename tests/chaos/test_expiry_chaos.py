"""Expiry with three worker processes at size (tests/test_expiry_workers.py's scenario):
``--chaos-messages / 10`` messages expire before the workers start, as many do not, and one
worker is killed with -9 mid-run: every expiry is announced, no expired message runs, every
other one is handled."""

from typing import Any

import pytest

from tests.redis_servers import RedisServer
from tests.test_expiry_workers import expire_among_workers
from tests.test_worker_processes import WorkerProcess, workers  # noqa: F401

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]


def test_expiry_with_a_worker_killed_at_size(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
    chaos_messages: int,
) -> None:
    expire_among_workers(
        workers, redis_server.url, settings, max(chaos_messages // 10, 100), kill_one=True
    )
