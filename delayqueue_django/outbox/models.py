"""The two tables that join a queue to the database's transactions: the outbox, and the
processed ids of EXACTLY_ONCE queues (registered through the app's models module)."""

from typing import ClassVar

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

# The outbox's index of each queue's rows in order (the relays read through it).
OUTBOX_QUEUE_INDEX = "delayqueue_outbox_queue"


class ExactCharField(models.CharField):  # type: ignore[type-arg]
    """Text compared byte for byte on every database: message ids and queue names differ by
    case alone ("aB" and "Ab" are two messages), and MySQL/MariaDB's default collations
    ignore case, which would make one message's record answer for another."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        column = super().db_type(connection)
        if connection.vendor == "mysql":
            return f"{column} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        return column


class OutboxMessage(models.Model):
    """A message written in the sender's database transaction, waiting for a relay to move
    it to its queue in Redis (see delayqueue_django.outbox.table)."""

    id = models.BigAutoField(primary_key=True)
    queue = ExactCharField(max_length=100)
    message_id = ExactCharField(max_length=100)
    payload = models.TextField()  # the JSON text, as send encoded it
    retry_count = models.PositiveIntegerField()
    # When the message is due, in ms since the epoch, fixed when the row was written on the
    # writing process's clock; a time already past when it is relayed means due at once.
    due_ms = models.BigIntegerField()
    written_ms = models.BigIntegerField()  # the writing process's clock, for the oldest's age
    # A keyed send's key (at most 256 bytes of UTF-8, so at most 256 characters), what it
    # does when the key's message waits ("keep" or "replace": the relay decides, and has no
    # caller to raise an "error" to) and its unique_for in ms (0: none). Defaults in the
    # database too, so that rows written by a process that predates keys still insert.
    message_key = ExactCharField(max_length=256, null=True, blank=True)
    if_exists = models.CharField(max_length=7, default="keep", db_default="keep")
    unique_ms = models.BigIntegerField(default=0, db_default=0)
    # An ordered group's name (at most 256 bytes of UTF-8; None: none). Nullable, so that
    # rows written by a process that predates groups still insert.
    message_group = ExactCharField(max_length=256, null=True, blank=True)
    # When the message expires (ms since the epoch, fixed when the row was written as its
    # due time is), or None: relayed after it, it is dead-lettered as expired at once.
    expires_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "delayqueue_outbox"
        default_permissions = ()
        verbose_name = "outbox message"
        # For the relays: each queue's rows, oldest first ("queue = %s ORDER BY id"), and a
        # poll's "has any?", read without scanning the rows of other queues.
        indexes: ClassVar = [models.Index(fields=["queue", "id"], name=OUTBOX_QUEUE_INDEX)]

    def __str__(self) -> str:
        return f"{self.queue}:{self.message_id}"


class ProcessedMessage(models.Model):
    """A message whose handler's transaction committed, on an EXACTLY_ONCE queue: a
    redelivery finds it here and is acked without running the handler again.

    One per message id and generation: a keyed message replaced after it was handled (a new
    payload under the same id) has a new generation, and runs. Unkeyed messages' generation
    is 0, as is that of every record written before keys."""

    id = models.BigAutoField(primary_key=True)
    queue = ExactCharField(max_length=100)
    message_id = ExactCharField(max_length=255)
    generation = models.BigIntegerField(default=0)
    processed_ms = models.BigIntegerField()

    class Meta:
        db_table = "delayqueue_processed"
        default_permissions = ()
        verbose_name = "processed message"
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["queue", "message_id", "generation"],
                name="delayqueue_processed_generation",
            )
        ]
        # For pruning: the old records of a queue, read as a range.
        indexes: ClassVar = [
            models.Index(fields=["queue", "processed_ms"], name="delayqueue_processed_age")
        ]

    def __str__(self) -> str:
        return f"{self.queue}:{self.message_id}"
