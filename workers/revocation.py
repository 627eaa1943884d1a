"""``celery control revoke TASK_ID`` also cancels the job in the database, so a revoked job
stays revoked when the worker restarts (Celery keeps revoked ids in worker memory only).

The worker's ``revoke`` control command is wrapped once, when this module is imported by the
worker (`workers.app`): Celery's own handling runs first, then the job row is cancelled.
"""

import logging
from typing import Any

from celery.utils.functional import maybe_list
from celery.worker.control import Panel

from workers.storage import repository

log = logging.getLogger(__name__)
_celery_revoke = Panel.data["revoke"]


def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kw: Any):
    reply = _celery_revoke(state, task_id, terminate, signal, **kw)
    task_ids = {str(t) for t in maybe_list(task_id) or []}
    for job in repository().cancel_tasks(task_ids):
        log.warning("task revoked: job %s is %s", job.id, job.status.value)
    return reply


revoke.__doc__ = _celery_revoke.__doc__
Panel.data["revoke"] = revoke
