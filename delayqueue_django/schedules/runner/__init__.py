"""A worker's share of a queue's schedules: no scheduler process, no lock.

Every worker of a queue keeps each of its schedules one tick ahead: when the waiting tick
falls due (it is being handed out), the worker writes the next one. Any number of workers
do so at the same moment; ``schedule.lua`` writes a tick only if it is later than the
schedule's cursor, so the first write of each tick time wins and the others are told where
the cursor is. A worker killed at any point leaves either the tick written (the others see
it) or not (the others write it): never none, never two.

Ticks no worker wrote in time (all workers down, say) are "missed"; so is a tick that
starts more than ``MISSED_AFTER`` after its time. The schedule's ``MISSED`` policy decides
what happens to them: ``skip`` them all, run ``once`` for all of them, or run ``all`` of
them, up to ``MISSED_LIMIT`` (the latest ones). The worker applies it twice: when it catches
up (which ticks it writes) and when a tick is handed out late (whether the handler runs: see
``declines``).

The schedules of settings are the union of what running workers declare: each worker
stores its own as it starts, declares them again at every read of the schedules (storing
again one Redis lost), and removes one no worker has declared for UNDECLARED_MS; it never
removes one just because its own settings lack it (see _keep_settings).

Each schedule is handled on its own: one that fails for a reason of its own (a TASK whose
queue no Tasks backend carries, a stored definition no longer readable, any exception
building its tick) is logged, recorded in the store for the admin and ``schedules.all()``
to show, and tried again later, while the queue's other schedules go on firing. Only a
Redis error (an outage) stops the whole pass.

``ScheduleRunner`` is built from parts, one module each, as a worker's consumer is: over
``state`` (the worker's view of the schedules, and the ticks built from them), ``failures``
(one schedule's failure kept its own), ``syncing`` (the store's schedules read, the
settings' ones declared), ``writing`` (the ticks written, a pass of ``run_due``) and
``judging`` (a tick handed out run or declined).
"""

from delayqueue_django.schedules.runner.judging import RunnerJudging
from delayqueue_django.schedules.runner.writing import RunnerWriting


class ScheduleRunner(RunnerWriting, RunnerJudging):
    """One queue's schedules in one worker. ``run_due`` is called from the queue's consumer
    loop; ``declines`` judges its ticks as they are handed out. Thread-safe."""


__all__ = ["ScheduleRunner"]
