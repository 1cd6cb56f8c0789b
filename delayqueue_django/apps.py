from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # Queues are built from DELAYQUEUES and may hold a cache's connection: rebuild them.
    # (USE_TZ and TIME_ZONE are read on every call, so they need nothing.)
    if setting in ("DELAYQUEUES", "CACHES"):
        from delayqueue_django.core import registry

        registry.reset()


class DelayQueueConfig(AppConfig):
    name = "delayqueue_django"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from delayqueue_django import checks  # noqa: F401  (registers the system checks)

        setting_changed.connect(_settings_changed, dispatch_uid="delayqueue_django.settings")
