"""Clone job: the Launch form's values from a train job's stored config."""

from typing import Any

from db import InvalidValue, JobKind, JobNotFound
from ui.handlers.algorithm_form import CUSTOM_ALGORITHM
from ui.handlers.common import parse_id
from ui.handlers.data_form import data_form
from ui.handlers.launch import FORM_FIELDS, JSONL_SOURCE, SINGLE_TURN, TASK_SOURCE
from ui.handlers.reward_form import reward_form
from ui.render import inert
from ui.services import Services
from workers.api import ALL_LINEAR, LAUNCH_DEFAULTS, LINEAR_MODULES, TRAINER_DEFAULTS, mode_defaults

NUMBERS = ("rank", "alpha", "dropout")  # of a lora table, each a field of the form


def clone_form(services: Services, job_id: float | str | None) -> tuple[dict[str, Any], str]:
    """(form values by field name, message): the job's settings, the defaults it ran with for
    any it did not set (the learning rate of its mode: LoRA's or full-weight's); no values
    and the reason for anything but a train job."""
    try:
        chosen = parse_id(job_id, "job")
        if chosen is None:
            return {}, "Choose a job to clone."
        job = services.repository.get_job(chosen)
    except (InvalidValue, JobNotFound) as exc:
        return {}, f"**Cannot clone:** {inert(exc)}"
    if job.kind is not JobKind.TRAIN:
        return {}, f"**Cannot clone:** job #{job.id} is a {job.kind.value} job, not a train job"
    lora = job.config.get("lora")
    config = {**TRAINER_DEFAULTS, **mode_defaults(lora is not None), **job.config}
    values = {name: config.get(name, LAUNCH_DEFAULTS.get(name)) for name in FORM_FIELDS}
    values["source"] = JSONL_SOURCE if config.get("data") else TASK_SOURCE
    values["environment"] = config.get("environment") or SINGLE_TURN
    values["preset"] = config.get("preset") or CUSTOM_ALGORITHM
    values.update(reward_form(config.get("reward")))
    values.update(data_form(config))
    values.update(_lora_form(lora))
    return values, f"Launch is filled in from job **#{job.id}**: change what you like, then Launch."


def _lora_form(lora: Any) -> dict[str, Any]:
    """The form's LoRA fields for a job's ``lora`` table (the defaults for what it omits)."""
    if not isinstance(lora, dict):
        return {"lora": False}
    targets = lora.get("target_modules", ALL_LINEAR)
    return {
        "lora": True,
        **{f"lora_{k}": lora.get(k, LAUNCH_DEFAULTS[f"lora_{k}"]) for k in NUMBERS},
        "lora_target_modules": list(LINEAR_MODULES if targets == ALL_LINEAR else targets),
        "lora_modules_to_save": list(lora.get("modules_to_save", [])),
    }
