from django.db import migrations, models

import delayqueue_django.outbox.models


class Migration(migrations.Migration):
    dependencies = [
        ("delayqueue_django", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", delayqueue_django.outbox.models.ExactCharField(max_length=100)),
                ("message_id", delayqueue_django.outbox.models.ExactCharField(max_length=100)),
                ("payload", models.TextField()),
                ("retry_count", models.PositiveIntegerField()),
                ("due_ms", models.BigIntegerField()),
                ("written_ms", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "outbox message",
                "db_table": "delayqueue_outbox",
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="ProcessedMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", delayqueue_django.outbox.models.ExactCharField(max_length=100)),
                ("message_id", delayqueue_django.outbox.models.ExactCharField(max_length=255)),
                ("processed_ms", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "processed message",
                "db_table": "delayqueue_processed",
                "default_permissions": (),
                "indexes": [
                    models.Index(fields=["queue", "processed_ms"], name="delayqueue_processed_age")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "message_id"), name="delayqueue_processed_once"
                    )
                ],
            },
        ),
    ]
