"""Tasks for the expiry and postpone tests (tests/test_expiry_api.py)."""

from __future__ import annotations

from delayqueue_django import Postpone, Retry
from delayqueue_django.tasks.compat import task

# How many more times ``postpones_then_runs`` postpones before it runs.
postpones_left = {"n": 0}


@task
def postpones_then_runs() -> str:
    if postpones_left["n"] > 0:
        postpones_left["n"] -= 1
        raise Postpone(0)
    return "ran"


@task
def retries_later() -> None:
    raise Retry(60)
