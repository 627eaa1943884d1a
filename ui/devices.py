"""A job's devices as the UI shows them (issue 31: one job across several devices): how many
and of which type, as ranks ("1 cpu", "2 cpu ranks", "4 cuda ranks"), for the Jobs and Queue
tables; and how many ranks the sample inspector counts a sample's rank of ("rank 1 of 2").

A job's config says ``devices`` (default 1) and may say ``device``; one that does not runs on
its worker's (`api.worker_device`).
"""

import ast
from collections.abc import Mapping
from typing import Any

from workers.api import TASK_FOR_KIND

JOB_TASKS = frozenset(TASK_FOR_KIND.values())  # the tasks whose first argument is a job id


def job_devices(config: Mapping[str, Any]) -> int:
    """The ranks a job runs as: its ``devices`` (1 when unset, or not a whole number >= 1,
    which the job's own check refuses)."""
    devices = config.get("devices", 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        return 1
    return devices


def devices_text(config: Mapping[str, Any], default_device: str) -> str:
    """A job's devices for a table cell: "1 cpu", "2 cpu ranks", "4 cuda ranks" (the device's
    type: ``cuda:1`` is cuda)."""
    kind = str(config.get("device") or default_device).partition(":")[0]
    devices = job_devices(config)
    return f"{devices} {kind}" + (" ranks" if devices > 1 else "")


def task_job_id(task: Mapping[str, Any]) -> int | None:
    """The job a queue task runs: a train, evaluate or compare task's first argument (a list,
    or its text as older workers reply); None for any other task."""
    if task.get("name") not in JOB_TASKS:
        return None
    args = task.get("args")
    if isinstance(args, str):
        try:
            args = ast.literal_eval(args)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if not isinstance(args, list | tuple) or not args:
        return None
    job_id = args[0]
    return job_id if isinstance(job_id, int) and not isinstance(job_id, bool) else None
