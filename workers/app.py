"""The Celery app, configured from the environment (see `workers.settings`).

``celery -A workers.app worker --pool threads -c 1 -Q gpu`` runs a GPU worker (``rlwb worker``
does the same). This module imports no torch: tasks load the engine lazily, in the worker.
"""

import threading
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutting_down

from workers import revocation  # noqa: F401  (revoke also cancels the job in the database)
from workers.control import SHUTTING_DOWN
from workers.recovery import watch
from workers.settings import Settings, celery_config
from workers.storage import repository

app = Celery("rlwb", include=["workers.tasks"])
app.conf.update(celery_config(Settings.from_env()))
RECOVERY_STOP = threading.Event()


@worker_ready.connect
def _recover_orphans(sender: Any = None, **_: Any) -> None:
    """Watch for jobs whose worker died (their heartbeat stopped) and re-queue them, and for
    queued jobs whose message is gone (purged) and send them again."""
    threading.Thread(
        target=watch,
        args=(sender.app, repository(), Settings.from_env(), RECOVERY_STOP),
        name="recover",
        daemon=True,
    ).start()


@worker_shutting_down.connect
def _stop_jobs(**_: Any) -> None:
    """Warm shutdown: the running job stops at its next step, is released (the attempt does
    not count) and goes back to the queue."""
    SHUTTING_DOWN.set()
    RECOVERY_STOP.set()
