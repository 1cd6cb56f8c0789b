from django.db import migrations, models


class Migration(migrations.Migration):
    """Expiring sends through the outbox (issue #27): a row keeps when its message expires.
    Nullable, so that a process still running the previous version during a deploy writes
    its rows as before (never expiring)."""

    dependencies = [
        ("delayqueue_django", "0006_outbox_groups"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="expires_ms",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
