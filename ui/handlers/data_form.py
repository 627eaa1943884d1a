"""Launch form: a data file's column mapping and held-out settings (`workers.specs`)."""

from typing import Any

from db import InvalidValue
from ui.handlers.common import parse_number

# The form's data-file fields, named as the job's config names them.
DATA_FIELDS = ("prompt_column", "answer_column", "system_prompt", "heldout_fraction", "heldout_k")
TEXT_FIELDS = DATA_FIELDS[:3]


def data_settings(form: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The config's column mapping and held-out settings for a data job, each only when set:
    a blank column is automatic, a blank system prompt none, a held-out fraction of 0 no
    held-out prompts (the every-N and prompt counts then left out too), a mean@k of 0 off.
    Ranges are the job's check (`api.validate_job`, `api.check_data_records`)."""
    config: dict[str, Any] = {}
    for name in TEXT_FIELDS:
        text = form.get(name) or ""
        value = text if name == "system_prompt" else text.strip()
        if value:
            config[name] = value
    numbers = {}
    for name in ("heldout_fraction", "heldout_k", "heldout_every", "heldout_prompts"):
        try:
            numbers[name] = parse_number(form.get(name), name)
        except InvalidValue as exc:
            problems.append(str(exc))
    if not numbers.get("heldout_fraction"):
        return config
    config["heldout_fraction"] = numbers["heldout_fraction"]
    for name in ("heldout_every", "heldout_prompts", "heldout_k"):
        number = numbers.get(name)
        if number is None or (name == "heldout_k" and number == 0):
            continue
        if number != int(number):
            problems.append(f"{name}: a whole number is required")
        else:
            config[name] = int(number)
    return config


def data_form(config: dict[str, Any]) -> dict[str, Any]:
    """The form's data-file fields for a job's config (blank or 0 where it set none)."""
    values: dict[str, Any] = {name: config.get(name) or "" for name in TEXT_FIELDS}
    values["heldout_fraction"] = config.get("heldout_fraction") or 0
    values["heldout_k"] = config.get("heldout_k") or 0
    return values
