from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop (delayqueue_django example)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from shop import receivers  # noqa: F401  (connects the signal receivers)
