"""The servers of a ``ShardedStore`` that hung: their shards left out of fetches until a
probe answers.

A server that does not answer a fetch in time (paused, swapping, cut off by a partition
that drops packets) is not asked again by a fetch while it stays so: each time would hold
the fetch, and the deliveries it already took from the other shards, for the wait again.
Whether it answers is asked in a thread of its own (one probe at a time per server, after a
backoff that grows to PROBE_LIMIT_SECONDS): a probe of a server still hung waits out the
socket timeout there, not in a fetch. Once a probe answers, its shards are fetched from
again at once; a fetch left unanswered is repeated there with the same request (the shard
hands out again what it took then).
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger("delayqueue_django.engine")

# How long a fetch waits for one shard before it holds that shard's server as hung.
FETCH_PATIENCE_SECONDS = 1.0
# How long a hung server waits before its first probe (as long as a shard that failed
# waits for its retry, engine.sharding.layouts.SHARD_RETRY_SECONDS), and at most between the
# end of one and the next (a probe of a server still hung takes the socket timeout too).
FIRST_PROBE_SECONDS = 1.0
PROBE_LIMIT_SECONDS = 2.0


@dataclass(slots=True)
class Hang:
    """One hung server: since when, its shards, and when a probe may next ask it (until
    then, the fetches leave its shards out, and a consumer with nothing else due sleeps)."""

    since: float
    shards: set[str]
    delay: float = FIRST_PROBE_SECONDS
    probe_at: float = field(default=0.0)
    probing: bool = False

    def next_delay(self) -> float:
        """The wait before the next probe: doubling up to the limit, with up to 25% more
        (never less: a server is not asked more often than a shard that failed)."""
        delay, self.delay = self.delay, min(self.delay * 2, PROBE_LIMIT_SECONDS)
        return delay * random.uniform(1.0, 1.25)

    def probe_failed(self, now: float) -> None:
        """Its probe got no answer: the next one after the backoff, from now (not from
        when this one began: it may have waited out the socket timeout)."""
        self.probing = False
        self.probe_at = now + self.next_delay()


class HungServers:
    """server name -> its Hang; the caller's lock guards it (the fetch plan's)."""

    def __init__(self) -> None:
        self.hangs: dict[str, Hang] = {}

    def hold(self, server: str, shards: set[str], now: float) -> Hang:
        """Hold ``server`` (with ``shards`` on it) as hung; its Hang, new or as it was."""
        hang = self.hangs.get(server)
        if hang is None:
            hang = self.hangs[server] = Hang(since=now, shards=set(shards))
            hang.probe_at = now + hang.next_delay()
        else:
            hang.shards |= shards
        return hang

    def due(self, now: float) -> tuple[list[tuple[str, Hang]], list[Hang]]:
        """The hangs whose probe is due, each marked probing; and every hang whose time
        came, probing already or not, looked at again after its delay (a consumer with
        nothing else due sleeps until then, rather than wake at once again)."""
        passed = [(server, hang) for server, hang in self.hangs.items() if hang.probe_at <= now]
        due = [(server, hang) for server, hang in passed if not hang.probing]
        for _, hang in passed:
            hang.probing = True
            hang.probe_at = now + hang.delay
        return due, [hang for _, hang in passed]


def start_probe(
    server: str, probe: Callable[[], object], done: Callable[[bool], None]
) -> threading.Thread:
    """``probe()`` in a daemon thread of its own; ``done(answered)`` after it."""

    def run() -> None:
        try:
            probe()
        except Exception as error:
            logger.debug("server %s still does not answer: %s", server, error)
            done(False)
        else:
            done(True)

    thread = threading.Thread(target=run, name="delayqueue-shard-probe", daemon=True)
    thread.start()
    return thread


def wait_for_probes(probes: list[threading.Thread], patience: float) -> None:
    """Wait for ``probes`` to end, ``patience`` seconds at the most in all."""
    deadline = time.monotonic() + patience
    for probe in probes:
        probe.join(max(deadline - time.monotonic(), 0.0))
