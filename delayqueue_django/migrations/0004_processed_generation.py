from django.db import migrations, models


class Migration(migrations.Migration):
    """Processed records per message id and generation (keyed messages, issue #26): the
    old rows, all of unkeyed messages, get generation 0 and stay unique."""

    dependencies = [
        ("delayqueue_django", "0003_outbox_queue_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="processedmessage",
            name="generation",
            field=models.BigIntegerField(default=0),
        ),
        # The new constraint first: records stay unique by message all along.
        migrations.AddConstraint(
            model_name="processedmessage",
            constraint=models.UniqueConstraint(
                fields=("queue", "message_id", "generation"),
                name="delayqueue_processed_generation",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="processedmessage",
            name="delayqueue_processed_once",
        ),
    ]
