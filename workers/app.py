"""The Celery app, configured from the environment (see `workers.settings`).

``celery -A workers.app worker --pool threads -c 1 -Q gpu`` runs a GPU worker (``rlwb worker``
does the same). This module imports no torch: tasks load the engine lazily, in the worker.
"""

import threading
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutting_down

from workers.control import SHUTTING_DOWN
from workers.recovery import recover_orphans
from workers.settings import Settings, celery_config
from workers.storage import repository

app = Celery("rlwb", include=["workers.tasks"])
app.conf.update(celery_config(Settings.from_env()))


@worker_ready.connect
def _recover_orphans(sender: Any = None, **_: Any) -> None:
    """Re-queue jobs left running by a dead worker (in a thread: the worker must be able to
    answer the ``inspect`` broadcast this sends)."""
    threading.Thread(
        target=recover_orphans, args=(sender.app, repository()), name="recover", daemon=True
    ).start()


@worker_shutting_down.connect
def _stop_jobs(**_: Any) -> None:
    """Warm shutdown: the running job stops at its next step and goes back to the queue."""
    SHUTTING_DOWN.set()
