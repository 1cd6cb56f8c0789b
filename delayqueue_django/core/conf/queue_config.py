"""``QueueConfig``: one queue's options as the rest of the package reads them, validated,
with defaults filled in and durations in ms (see core.conf)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from delayqueue_django.core.conf.urls import MEMORY_URL_PREFIX


@dataclass(frozen=True)
class QueueConfig:
    """The options of one queue, validated, with defaults filled in and durations in ms."""

    name: str
    redis_alias: str | None
    url: str | None
    options: Mapping[str, Any]
    handler: str | None
    retry_count: int
    max_consume_ms: int
    nack_delays_ms: tuple[int, ...]
    key_prefix: str
    garbage_retention_ms: int | None
    max_payload_bytes: int
    fetch_batch_size: int
    stage_batch_size: int
    send_batch_size: int
    send_on_commit: bool
    # What the feature wings read from their options (core.features), by option name.
    feature_options: Mapping[str, object] = field(default_factory=dict)
    outbox: bool = False
    # The database alias processed message ids are recorded in, or None: at least once.
    exactly_once: str | None = None
    exactly_once_retention_ms: int = 7 * 24 * 3600 * 1000
    # The layout new messages are spread over (1: the queue's one set of keys).
    shards: int = 1
    # The flow gates (docs/guides/flow-control.md): at most rate_limit[0] hand-outs per
    # rate_limit[1] ms over all workers (None: no limit), at most max_in_flight deliveries
    # in flight (0: no cap).
    rate_limit: tuple[int, int] | None = None
    max_in_flight: int = 0
    # Seconds a handler may run before it is stopped (see worker.time_limits), or None.
    time_limit: float | None = None
    # Expiry and postpones (see core.conf.expiry): the default expiry after a message's due
    # time (None: none), and how often one message may be postponed.
    expires_ms: int | None = None
    max_postpones: int = 100
    # Attempt records (see core.conf.history): the most a message keeps, and the dotted
    # path of the callable that cleans an error before it is stored (None: none).
    history_attempts: int = 5
    history_redact: str | None = None
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def memory_name(self) -> str | None:
        """The in-memory store's name for a ``memory://name`` URL ("" for ``memory://``), or
        None for a queue on Redis."""
        if self.url is None or not self.url.startswith(MEMORY_URL_PREFIX):
            return None
        return self.url.removeprefix(MEMORY_URL_PREFIX)

    def nack_delay_ms(self, attempt: int) -> int:
        """The wait before retrying a delivery that failed on ``attempt`` (1-based)."""
        delays = self.nack_delays_ms
        return delays[min(max(attempt, 1), len(delays)) - 1]
