from django.contrib import admin

from shop.models import Event, Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "item", "status", "created", "pay_by"]
    list_filter = ["status"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created", "queue", "kind", "message_id", "text"]
    list_filter = ["queue", "kind"]
