"""Django settings for the benchmark and its worker processes: one queue, on the private
Redis the benchmark started (its URL comes in ``DQ_BENCH_REDIS_URL``; its ``SHARDS`` in
``DQ_BENCH_SHARDS``, for the sharding benchmark's cluster; more options in ``DQ_BENCH_QUEUE``)."""

import json
import os
from typing import Any

SECRET_KEY = "benchmarks-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "delayqueue_django"]
# A database only for the outbox benchmark (benchmarks/outbox.py), in its own process.
_DATABASE = os.environ.get("DQ_BENCH_DATABASE")
DATABASES: dict[str, Any] = {"default": json.loads(_DATABASE)} if _DATABASE else {}
DELAYQUEUE_OUTBOX_DATABASES = list(DATABASES)

DELAYQUEUES = {
    "default": {
        "URL": os.environ.get("DQ_BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
        "HANDLER": os.environ.get("DQ_BENCH_HANDLER", "benchmarks.handlers.noop"),
        "SHARDS": int(os.environ.get("DQ_BENCH_SHARDS", "1")),
        # More options of the queue, as JSON (the kills benchmark's EXACTLY_ONCE workers).
        **json.loads(os.environ.get("DQ_BENCH_QUEUE", "{}")),
    }
}
