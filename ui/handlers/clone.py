"""Clone job: the Launch form's values from a train job's stored config."""

from typing import Any

from db import InvalidValue, JobKind, JobNotFound
from ui.handlers.common import parse_id
from ui.handlers.launch import FORM_FIELDS, JSONL_SOURCE, TASK_DEFAULT_REWARD, TASK_SOURCE
from ui.render import inert
from ui.services import Services
from workers.api import LAUNCH_DEFAULTS, TRAINER_DEFAULTS


def clone_form(services: Services, job_id: float | str | None) -> tuple[dict[str, Any], str]:
    """(form values by field name, message): the job's settings, the trainer's defaults for
    any it did not set; no values and the reason for anything but a train job."""
    try:
        chosen = parse_id(job_id, "job")
        if chosen is None:
            return {}, "Choose a job to clone."
        job = services.repository.get_job(chosen)
    except (InvalidValue, JobNotFound) as exc:
        return {}, f"**Cannot clone:** {inert(exc)}"
    if job.kind is not JobKind.TRAIN:
        return {}, f"**Cannot clone:** job #{job.id} is a {job.kind.value} job, not a train job"
    config = {**TRAINER_DEFAULTS, **job.config}
    values = {name: config.get(name, LAUNCH_DEFAULTS.get(name)) for name in FORM_FIELDS}
    values["source"] = JSONL_SOURCE if config.get("data") else TASK_SOURCE
    values["reward"] = config.get("reward") or TASK_DEFAULT_REWARD
    return values, f"Launch is filled in from job **#{job.id}**: change what you like, then Launch."
