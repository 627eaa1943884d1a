"""Queue tab: the workers online, their active and reserved jobs, and the Celery commands."""

from typing import Any

import pandas as pd

from db import JobStatus
from ui.render import inert
from ui.services import Services
from workers.api import COMMANDS

TASK_COLUMNS = ["worker", "task_id", "name", "args"]

QueueView = tuple[str, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]


def _tasks(tasks: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [[str(t.get(c, "")) for c in TASK_COLUMNS] for t in tasks], columns=TASK_COLUMNS
    )


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
    from `workers.api.queue_overview`."""
    try:
        overview = services.queue_overview()
    except Exception as exc:  # the broker is down or unreachable: say so, keep the page up
        empty = _tasks([])
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
    return (
        summary,
        pd.DataFrame({"worker": workers}),
        _tasks(active),
        _tasks(reserved),
        commands,
    )
