from django.db import migrations

import delayqueue_django.outbox.models


class Migration(migrations.Migration):
    """Grouped sends through the outbox (issue #27): a row keeps its ordered group. Nullable,
    so that a process still running the previous version during a deploy writes its rows as
    before (ungrouped)."""

    dependencies = [
        ("delayqueue_django", "0005_outbox_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="message_group",
            field=delayqueue_django.outbox.models.ExactCharField(
                blank=True, max_length=256, null=True
            ),
        ),
    ]
