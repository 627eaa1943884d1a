"""How far along a running job is: the ETA from the pace of its versions so far."""

from db import JobInfo, PolicyVersionInfo


def eta_seconds(versions: list[PolicyVersionInfo], job: JobInfo) -> float | None:
    """Seconds left at the pace from the job's first recorded version to its newest (None
    before two versions exist or without a step count)."""
    if len(versions) < 2 or not job.total_steps:
        return None
    first, last = versions[0], versions[-1]
    steps = last.version - first.version
    if steps <= 0:
        return None
    per_step = (last.created_at - first.created_at).total_seconds() / steps
    return max(job.total_steps - job.step, 0) * per_step


def duration(seconds: float) -> str:
    """``1h 02m``, ``3m 05s`` or ``42s``."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
