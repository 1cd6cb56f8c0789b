"""The app's models, where Django looks for them: an unmanaged model, so the admin lists the
queues in its sidebar and Django creates the permissions that guard the queue pages; and
the outbox wing's two tables (outbox/models.py), registered by being imported here."""

from django.db import models

from delayqueue_django.outbox.models import OutboxMessage, ProcessedMessage

__all__ = ["OutboxMessage", "ProcessedMessage", "Queue"]


class Queue(models.Model):
    """A delay queue as the admin shows it; the queues themselves live in Redis."""

    class Meta:
        managed = False
        # view: see counts, messages and workers; change: requeue, deliver now;
        # delete: delete messages, purge dead letters.
        default_permissions = ("view", "change", "delete")
        verbose_name = "queue"
        verbose_name_plural = "queues"

    def __str__(self) -> str:
        return "queue"
