"""A worker's pruning rounds of the processed records of its EXACTLY_ONCE queues, each in a
thread of its own.

Pruning asks each queue's Redis which messages it still holds: a Redis that hangs holds its
caller until the socket timeout, queue after queue, round after round. The worker's
database thread, which also relays the outbox of every queue, only starts a round; so a
sick queue's Redis delays the pruning of records, never the relay of the healthy queues'
rows. A round still running when the next is due is left to finish, not joined by another.
"""

import logging
import threading
from collections.abc import Sequence

from django.db import connections

from delayqueue_django.outbox.exactly_once import prune_queues

logger = logging.getLogger("delayqueue_django.worker")


class PruneRounds:
    """``start()`` starts a pruning round of ``names`` in a daemon thread, unless the last
    one is still running."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self._lock = threading.Lock()
        self._running: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._running is not None and self._running.is_alive():
                logger.info(
                    "the last pruning round of processed-message records is still running "
                    "(a queue's Redis slow to answer): this one is skipped"
                )
                return
            self._running = threading.Thread(
                target=self._round, name="delayqueue-prune", daemon=True
            )
            self._running.start()

    def _round(self) -> None:
        try:
            prune_queues(self.names)
        except Exception:
            logger.exception("pruning processed-message records failed; trying again later")
        finally:
            # The round's thread ends: its connections with it (none outlives a round, so a
            # database restarted meanwhile costs no round).
            connections.close_all()
