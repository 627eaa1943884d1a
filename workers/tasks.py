"""The Celery tasks: thin wrappers that run a job by id (`workers.jobs.run_job`).

torch and the engine are imported inside the task, in the worker process, never at import.
"""

from typing import Any

from celery import Task
from celery.exceptions import Reject

from workers.app import app, repository
from workers.control import Stop, revoked
from workers.settings import Settings


def _run(task: Task, job_id: int) -> dict[str, Any]:
    from workers.jobs import run_job

    def progress(meta: dict[str, Any]) -> None:
        if not task.request.called_directly:
            task.update_state(state="PROGRESS", meta=meta)

    outcome = run_job(
        repository(), job_id, Settings.from_env(), task.request.id, progress, queued=True
    )
    if outcome.stop is Stop.SHUTDOWN:
        raise Reject("worker shutting down: job goes back to the queue", requeue=True)
    return {"job_id": job_id, "status": outcome.status, "error": outcome.error}


@app.task(bind=True, name="workers.train")
def train(self: Task, job_id: int) -> dict[str, Any]:
    """Run (or resume) a GRPO training job."""
    return _run(self, job_id)


@app.task(bind=True, name="workers.evaluate")
def evaluate(self: Task, job_id: int) -> dict[str, Any]:
    """Evaluate one saved version on a prompt set."""
    return _run(self, job_id)


@app.task(bind=True, name="workers.chat")
def chat(
    self: Task,
    job_id: int,
    version: int,
    messages: list[dict[str, str]],
    temperature: float,
    max_tokens: int,
    seed: int | None = None,
) -> dict[str, Any]:
    """One Playground turn (the ``interactive`` queue; see `workers.chat`); a revoke stops
    its generation at the next step."""
    from workers.chat import chat_reply

    settings, cancelled = Settings.from_env(), revoked(self.request.id)
    return chat_reply(
        repository(), settings, job_id, version, messages, temperature, max_tokens, seed, cancelled
    )


@app.task(bind=True, name="workers.audit")
def audit(self: Task, sample_ids: list[int]) -> dict[str, Any]:
    """Re-score stored samples under their stamped versions (``interactive``; see
    `workers.scoring`); a revoke stops it before the next sample."""
    from workers.scoring import audit_samples

    return audit_samples(repository(), Settings.from_env(), sample_ids, revoked(self.request.id))


@app.task(name="workers.token_diff")
def token_diff(
    sample_id: int,
    version_a: int,
    version_b: int,
    job_a: int | None = None,
    job_b: int | None = None,
) -> dict[str, Any]:
    """One stored response scored under two versions, of one job or two (``interactive``)."""
    from workers.scoring import token_diff as diff

    return diff(repository(), Settings.from_env(), sample_id, version_a, version_b, job_a, job_b)


@app.task(bind=True, name="workers.compare")
def compare(self: Task, job_id: int) -> dict[str, Any]:
    """Evaluate two versions on the same prompts with the same seeds."""
    return _run(self, job_id)
