"""Settings for chaos worker processes: the test settings, plus what the test passes as JSON
in ``DQ_CHAOS_SETTINGS`` (DELAYQUEUES, CACHES, DJANGO_REDIS_CONNECTION_FACTORY)."""

import json
import os

from tests.settings import *  # noqa: F403

globals().update(json.loads(os.environ["DQ_CHAOS_SETTINGS"]))
