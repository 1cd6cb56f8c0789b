"""What the worker's start-up banner says of a queue beyond its basics: the limits its
settings set (RATE_LIMIT, MAX_IN_FLIGHT, TIME_LIMIT, EXPIRES), a rate limit set at run time
in their place, and a pause. Only what is set is said: a queue with none of them adds no
line. The pause and the run-time rate are kept in Redis: one round trip reads them."""

from redis.exceptions import RedisError

from delayqueue_django.core.conf.flow import shown_rate
from delayqueue_django.core.queue import Flow, Queue
from delayqueue_django.exceptions import DelayQueueError

INDENT = "    "


def limits_lines(queue: Queue) -> list[str]:
    """The banner's lines under the queue's own line (none when nothing is set)."""
    try:
        flow: Flow | None = queue.flow()
    except (DelayQueueError, RedisError):
        flow = None  # the worker waits for Redis anyway; its outage is logged there
    lines = []
    limits = _limits(queue, flow)
    if limits:
        lines.append(INDENT + ", ".join(limits))
    if flow is None:
        lines.append(f"{INDENT}pause and run-time rate limit: unknown until Redis answers")
    elif flow.paused:
        lines.append(
            f"{INDENT}PAUSED: no worker hands out its messages until it is resumed "
            f"(manage.py delayqueue_pause {queue.name} --resume, or the admin)"
        )
    return lines


def _limits(queue: Queue, flow: Flow | None) -> list[str]:
    config = queue.config
    limits = []
    setting = shown_rate(config.rate_limit)
    if flow is not None and flow.rate_limit_overridden:
        instead = f"RATE_LIMIT {setting}" if setting else "no RATE_LIMIT"
        limits.append(f"rate limit {flow.rate_limit} (set at run time, in place of {instead})")
    elif setting:
        limits.append(f"rate limit {setting}")
    if config.max_in_flight:
        limits.append(f"max in flight {config.max_in_flight}")
    if config.time_limit is not None:
        limits.append(f"time limit {config.time_limit:g} s")
    if config.expires_ms is not None:
        limits.append(f"expires {config.expires_ms / 1000:g} s after due")
    return limits
