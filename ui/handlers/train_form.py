"""The Launch form's training fields as a job sets them: its numbers (`api.JOB_FIELDS`), the
LoRA table, and the pipeline with the policy lag it needs."""

from typing import Any

from db import InvalidValue
from ui.handlers.common import parse_number
from workers import api

SYNC = "sync"
_PIPELINE_LABELS = {
    SYNC: "generate, then train",
    "one_step": "generate the next batch while training (lag 1)",
    "in_flight": "also update weights mid-generation (lag <= 1)",
}
# (label, value) of each pipeline mode (`GRPOConfig.pipeline`, whose check is the job's)
PIPELINE_CHOICES = [(f"{mode}: {_PIPELINE_LABELS[mode]}", mode) for mode in api.PIPELINE_MODES]
PIPELINED = set(api.PIPELINE_MODES) - {SYNC}
PIPELINE_INFO = (
    "overlap generation with training: faster, on samples up to one version old "
    "(importance-weighted); needs max policy lag >= 1 and one update per batch"
)


def job_number(name: str, value: float | str | None, problems: list[str]) -> float | int | None:
    """A required number of the form (a whole one for an int field of `api.JOB_FIELDS`), or
    None and a problem; its range is the job's check (`api.validate_job`)."""
    try:
        number = parse_number(value, name)
    except InvalidValue as exc:
        problems.append(str(exc))
        return None
    if number is None:
        problems.append(f"{name}: required")
        return None
    if api.JOB_FIELDS[name].kind is not int:
        return number
    if number != int(number):
        problems.append(f"{name}: a whole number is required")
        return None
    return int(number)


def lora_table(
    enabled: bool,
    rank: float | str | None,
    alpha: float | str | None,
    dropout: float | str | None,
    targets: list[str] | None,
    saved: list[str] | None,
    problems: list[str],
) -> dict[str, Any] | None:
    """The job's ``lora`` table from the form (None: LoRA off, every weight trained); every
    target module ticked is "all-linear". Its ranges and names are the job's check
    (`LoraSettings`, through `api.validate_job`)."""
    if not enabled:
        return None
    lora: dict[str, Any] = {}
    for name, value in (("rank", rank), ("alpha", alpha), ("dropout", dropout)):
        try:
            number = parse_number(value, f"lora {name}")
        except InvalidValue as exc:
            problems.append(str(exc))
            continue
        if number is None:
            problems.append(f"lora {name}: required")
        elif name == "rank" and number == int(number):
            lora[name] = int(number)
        else:
            lora[name] = number
    targets = list(targets or [])
    lora["target_modules"] = api.ALL_LINEAR if set(targets) == set(api.LINEAR_MODULES) else targets
    if saved:
        lora["modules_to_save"] = list(saved)
    return lora


def lag_for_pipeline(pipeline: str | None, lag: float | str | None) -> float | str | None:
    """The max policy lag a job runs with: 1 where a pipelined mode (which trains samples one
    version old) was chosen with a lag of 0, else the form's (a bad value stays for the job's
    check to name)."""
    try:
        shown = parse_number(lag, "max_policy_lag")
    except InvalidValue:
        return lag
    return 1 if pipeline in PIPELINED and shown == 0 else lag
