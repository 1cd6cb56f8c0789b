from django.db import migrations, models

import delayqueue_django.outbox.models


class Migration(migrations.Migration):
    """Keyed sends through the outbox (issue #26): a row keeps its key, if_exists and
    unique_for (in ms). The defaults are the database's too, so that a process still running
    the previous version during a deploy writes its rows as before (unkeyed)."""

    dependencies = [
        ("delayqueue_django", "0004_processed_generation"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="message_key",
            field=delayqueue_django.outbox.models.ExactCharField(
                blank=True, max_length=256, null=True
            ),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="if_exists",
            field=models.CharField(db_default="keep", default="keep", max_length=7),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="unique_ms",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
    ]
