from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DELAYQUEUES", "CACHES", "USE_TZ", "TIME_ZONE"):
        from delayqueue_django import registry

        registry.reset()


class DelayQueueConfig(AppConfig):
    name = "delayqueue_django"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from delayqueue_django import checks  # noqa: F401  (registers the system checks)

        setting_changed.connect(_settings_changed, dispatch_uid="delayqueue_django.settings")
