from django.db import migrations


class Migration(migrations.Migration):
    """An order's timers are found by their keys (Order.expiry_key): no message id is kept."""

    dependencies = [
        ("shop", "0001_initial"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="order",
            name="expiry_message_id",
        ),
    ]
