from django.db import models


class Order(models.Model):
    class Status(models.TextChoices):
        AWAITING_PAYMENT = "awaiting", "awaiting payment"
        PAID = "paid", "paid"
        CANCELLED = "cancelled", "cancelled (not paid in time)"

    item = models.CharField(max_length=100)
    status = models.CharField(
        max_length=20, choices=Status.choices, default=Status.AWAITING_PAYMENT
    )
    created = models.DateTimeField(auto_now_add=True)
    pay_by = models.DateTimeField()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"order #{self.pk} ({self.item}, {self.get_status_display()})"

    # The keys of the order's timers: paying cancels the expiry by its key, so no message id
    # needs a column of its own.
    @property
    def expiry_key(self) -> str:
        return f"order-{self.pk}-expiry"

    @property
    def reminder_key(self) -> str:
        return f"order-{self.pk}-reminder"


class Event(models.Model):
    """What happened, for the page: written by the handlers and the signal receivers."""

    created = models.DateTimeField(auto_now_add=True)
    queue = models.CharField(max_length=100)
    kind = models.CharField(max_length=30)
    message_id = models.CharField(max_length=64, blank=True)
    text = models.CharField(max_length=300)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.created:%H:%M:%S} {self.queue} {self.kind}: {self.text}"
