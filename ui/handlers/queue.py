"""Queue tab: the workers online, their active and reserved jobs, and the Celery commands."""

from typing import Any

import pandas as pd

from ui.render import inert
from ui.services import Services

TASK_COLUMNS = ["worker", "task_id", "name", "args"]

QueueView = tuple[str, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]


def _tasks(tasks: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [[str(t.get(c, "")) for c in TASK_COLUMNS] for t in tasks], columns=TASK_COLUMNS
    )


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
    jobs = " · ".join(f"{count} {status}" for status, count in overview.get("jobs", {}).items())
    summary = (
        f"**{len(workers)}** worker(s) online · **{len(active)}** active · "
        f"**{len(reserved)}** reserved · broker: {overview.get('broker', '?')}"
        + (f" · jobs in the database: {jobs}" if jobs else "")
    )
    commands = "\n".join(
        f"# {what}\n{command}" for what, command in overview.get("commands", {}).items()
    )
    return (
        summary,
        pd.DataFrame({"worker": workers}),
        _tasks(active),
        _tasks(reserved),
        commands,
    )
