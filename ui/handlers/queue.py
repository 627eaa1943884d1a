"""Queue tab: the workers online, their active and reserved jobs, and the Celery commands."""

from typing import Any

import pandas as pd

from db import JobNotFound, JobStatus
from ui.devices import devices_text, task_job_id
from ui.render import inert
from ui.services import Services
from workers.api import COMMANDS, worker_device

TASK_COLUMNS = ["worker", "task_id", "name", "args", "devices"]

QueueView = tuple[str, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]


def _devices(services: Services, task: dict[str, Any], device: str) -> str:
    """A job task's devices, as the Jobs table shows them ("" for any other task)."""
    job_id = task_job_id(task)
    if job_id is None:
        return ""
    try:
        return devices_text(services.repository.get_job(job_id).config, device)
    except JobNotFound:
        return ""


def _tasks(services: Services, tasks: list[dict[str, Any]], device: str) -> pd.DataFrame:
    """The tasks, a job's with its devices."""
    rows = [
        [*(str(t.get(c, "")) for c in TASK_COLUMNS[:-1]), _devices(services, t, device)]
        for t in tasks
    ]
    return pd.DataFrame(rows, columns=TASK_COLUMNS)


def _commands(commands: dict[str, str]) -> str:
    return "\n".join(f"# {what}\n{command}" for what, command in commands.items())


def _job_counts(counts: dict[str, int]) -> str:
    jobs = " · ".join(f"{count} {status}" for status, count in counts.items())
    return f" · jobs in the database: {jobs}" if jobs else ""


def queue_first_view(services: Services) -> tuple[str, str]:
    """(summary, commands) from the database alone, in milliseconds: what the tab shows at
    once, while `queue_view` asks the workers (a broadcast takes about a second)."""
    counts = {
        status.value: services.repository.count_jobs(status=status)
        for status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)
    }
    summary = "Asking the workers…" + _job_counts(counts)
    return summary, _commands(COMMANDS)


def queue_view(services: Services) -> QueueView:
    """(summary, workers online, active tasks, reserved tasks, equivalent Celery commands),
    from `workers.api.queue_overview`; a job's task with the job's devices."""
    try:
        overview = services.queue_overview()
    except Exception as exc:  # the broker is down or unreachable: say so, keep the page up
        empty = _tasks(services, [], "")
        message = f"**Queue unreachable:** {type(exc).__name__}: {inert(exc)}"
        return message, pd.DataFrame(columns=["worker"]), empty, empty, ""
    workers = overview.get("workers", [])
    active, reserved = overview.get("active", []), overview.get("reserved", [])
    summary = (
        f"**{len(workers)}** worker(s) online · **{len(active)}** active · "
        f"**{len(reserved)}** reserved · broker: {overview.get('broker', '?')}"
        + _job_counts(overview.get("jobs", {}))
    )
    commands = _commands(overview.get("commands", {}))
    device = worker_device()
    return (
        summary,
        pd.DataFrame({"worker": workers}),
        _tasks(services, active, device),
        _tasks(services, reserved, device),
        commands,
    )
