"""A table that handlers write to, for the exactly-once tests: one row per run of a handler
(no unique key: a second run of the same message shows as a second row)."""

from django.db import models


class Effect(models.Model):
    message_id = models.CharField(max_length=100)
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.message_id
