"""Whether a MySQL/MariaDB outbox table has the relays' (queue, id) index yet.

The relay forces that index on MySQL/MariaDB (see OutboxRelay._take), but migration 0003
creates it, and a rolling deploy starts new relays before ``migrate`` runs: forcing an
index that does not exist fails every batch (error 1176). Until the index is there, the
relay reads through the primary key as it did before 0003, and says once which migration
to apply; it looks again now and then, and reads through the index once it appears.
"""

import logging
import time

from django.db import connections

logger = logging.getLogger("delayqueue_django.relay")

# How often a database found without the index is looked at again.
MISSING_INDEX_SECONDS = 60.0


class QueueIndex:
    """Per database alias: the clause that makes a MySQL/MariaDB read use the index."""

    def __init__(self) -> None:
        self._present: set[str] = set()
        self._missing_at: dict[str, float] = {}
        self._warned: set[str] = set()

    def force(self, alias: str) -> str:
        """`` FORCE INDEX (…)`` when ``alias`` has the index, else nothing (the planner's
        choice, the primary key's order)."""
        from delayqueue_django.outbox.models import OUTBOX_QUEUE_INDEX, OutboxMessage

        if alias in self._present:
            return f" FORCE INDEX ({OUTBOX_QUEUE_INDEX})"
        missing_at = self._missing_at.get(alias)
        if missing_at is not None and time.monotonic() < missing_at + MISSING_INDEX_SECONDS:
            return ""
        table = OutboxMessage._meta.db_table
        if self._exists(alias, table, OUTBOX_QUEUE_INDEX):
            self._present.add(alias)
            self._missing_at.pop(alias, None)
            return f" FORCE INDEX ({OUTBOX_QUEUE_INDEX})"
        self._missing_at[alias] = time.monotonic()
        if alias not in self._warned:
            self._warned.add(alias)
            logger.warning(
                "outbox relay: database %s has no index %s on %s yet; reading through the "
                "primary key (slower, and it locks other queues' rows) until migration "
                "delayqueue_django 0003 is applied: python manage.py migrate "
                "delayqueue_django --database %s",
                alias,
                OUTBOX_QUEUE_INDEX,
                table,
                alias,
            )
        return ""

    def forget(self, alias: str) -> bool:
        """Forget that ``alias`` had the index (a read forcing it failed: it was dropped);
        returns whether it was believed there."""
        if alias not in self._present:
            return False
        self._present.discard(alias)
        return True

    @staticmethod
    def _exists(alias: str, table: str, index: str) -> bool:
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM information_schema.statistics WHERE table_schema = DATABASE() "
                "AND table_name = %s AND index_name = %s LIMIT 1",
                [table, index],
            )
            return cursor.fetchone() is not None
