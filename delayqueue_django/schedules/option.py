"""A queue's SCHEDULES option, as the core reads it with the rest of DELAYQUEUES (see
core.features.plug_queue_option): the schedules declared in settings."""

from collections.abc import Mapping
from typing import Any, cast

from django.conf import settings

from delayqueue_django.core.conf.problem import SETTING
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.features import Report
from delayqueue_django.exceptions import InvalidSchedule
from delayqueue_django.schedules.definition import SETTINGS, Schedule, Subject, build

OPTION = "SCHEDULES"


def read_schedules(name: str, options: Mapping[str, Any], report: Report) -> tuple[Schedule, ...]:
    """The queue's SCHEDULES, each checked (E040-E048); what is wrong is reported."""
    where = f"{SETTING}[{name!r}]['SCHEDULES']"
    declared = options["SCHEDULES"]
    if not isinstance(declared, Mapping):
        report(
            "E040",
            f"{where} must be a dict of schedules by name, not {type(declared).__name__}.",
            hint='e.g. {"nightly-report": {"CRON": "0 3 * * *", "PAYLOAD": {"report": 1}}}',
        )
        return ()
    schedules = []
    time_zone = getattr(settings, "TIME_ZONE", None) or "UTC"
    for schedule_name, schedule_options in declared.items():
        try:
            schedules.append(
                build(
                    schedule_name,
                    schedule_options,
                    subject=Subject(f"{where}[{schedule_name!r}]"),
                    queue=name,
                    max_payload_bytes=options["MAX_PAYLOAD_BYTES"],
                    default_time_zone=time_zone,
                    source=SETTINGS,
                )
            )
        except InvalidSchedule as error:
            report(error.check_id, str(error))
    return tuple(schedules)


def declared_schedules(config: QueueConfig) -> tuple[Schedule, ...]:
    """The schedules a queue's settings declare (none before the wing is plugged in)."""
    # read_schedules' tuple, as the core keeps it.
    return cast(tuple[Schedule, ...], config.feature_options.get(OPTION, ()))
