from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("delayqueue_django", "0002_outbox_and_processed"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(fields=["queue", "id"], name="delayqueue_outbox_queue"),
        ),
    ]
