"""Settings for worker subprocesses: the test settings, with queues from the environment."""

import json
import os

from tests.settings import *  # noqa: F403

DELAYQUEUES = {
    "default": {
        "URL": os.environ["DQ_TEST_REDIS_URL"],
        "HANDLER": os.environ.get("DQ_TEST_HANDLER", "tests.worker_handlers.handle"),
        "MAX_CONSUME_DURATION": float(os.environ.get("DQ_TEST_MAX_CONSUME", "30")),
        "RETRY_COUNT": int(os.environ.get("DQ_TEST_RETRY_COUNT", "3")),
        "NACK_REDELIVERY_DELAY": 0,
        "SCHEDULES": json.loads(os.environ.get("DQ_TEST_SCHEDULES", "{}")),
        "SHARDS": int(os.environ.get("DQ_TEST_SHARDS", "1")),
        "TIME_LIMIT": json.loads(os.environ.get("DQ_TEST_TIME_LIMIT", "null")),
    }
}
if "DQ_TEST_SECOND_REDIS_URL" in os.environ:
    # A second queue, on a server of its own (or the same one), for a worker of two consumers.
    DELAYQUEUES["second"] = {
        "URL": os.environ["DQ_TEST_SECOND_REDIS_URL"],
        "HANDLER": os.environ.get("DQ_TEST_SECOND_HANDLER", "tests.worker_handlers.handle"),
        "NACK_REDELIVERY_DELAY": 0,
    }
