from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # Queues are built from DELAYQUEUES and may hold a cache's connection: rebuild them.
    # (USE_TZ and TIME_ZONE are read on every call, so they need nothing.)
    if setting in ("DELAYQUEUES", "CACHES"):
        from delayqueue_django.core import registry

        registry.reset()


def plug_in_features() -> None:
    """Fill the core's slots (core.features) with the wings: the one place that knows them
    all, so that the core imports none. (Imported here, not at the top: Django imports this
    module before the models can be, and the wings use them.)"""
    from delayqueue_django.core import features, registry
    from delayqueue_django.outbox import exactly_once, table
    from delayqueue_django.schedules import option
    from delayqueue_django.schedules.api import Schedules
    from delayqueue_django.tasks.plugin import TaskMessages

    features.plug_outbox(table)
    features.plug_handler_transaction(exactly_once)
    features.plug_tasks(TaskMessages())
    features.plug_queue_option(option.OPTION, option.read_schedules)
    features.plug_schedules(Schedules)
    # Settings parsed before (a module-level get_queue, say) had no wing to read theirs.
    registry.reset()


class DelayQueueConfig(AppConfig):
    name = "delayqueue_django"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from delayqueue_django import checks  # noqa: F401  (registers the system checks)

        plug_in_features()

        setting_changed.connect(_settings_changed, dispatch_uid="delayqueue_django.settings")
