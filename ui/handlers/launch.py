"""Launch tab: choices for the form, and turning the form into an enqueued training job."""

import os
from pathlib import Path
from typing import Any

from db import InvalidValue
from ui.files import UploadRefused, find_data_files, save_upload
from ui.handlers.common import parse_number
from ui.handlers.data_form import DATA_FIELDS, data_settings
from ui.handlers.reward_form import REWARD_FIELDS, TASK_DEFAULT_REWARD, reward_config
from ui.handlers.train_form import SYNC, job_number, lag_for_pipeline, lora_table
from ui.render import inert
from ui.services import Services
from workers import api

TASK_SOURCE = "built-in task"
JSONL_SOURCE = "data file"  # JSONL, JSON, CSV or Parquet
OUTPUT_DIR_PLACEHOLDER = "(chosen by the worker)"
SINGLE_TURN = ""  # the Environment choice of none: one response per prompt, scored by a reward
# The form's fields, in `train_config`'s order (also what "Clone job" fills in).
FORM_FIELDS = (
    "preset",
    "model",
    "source",
    "task",
    "data",
    "reward",
    "steps",
    "batch_size",
    "group_size",
    "lr",
    "temperature",
    "top_p",
    "max_tokens",
    "max_policy_lag",
    "kv_strategy",
    "clip_eps",
    "kl_coef",
    "seed",
    "updates_per_batch",
    "pipeline",
    "heldout_every",
    "heldout_prompts",
    "report_to",
    "lora",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_modules_to_save",
    "environment",
    "max_turns",
    "max_episode_tokens",
    "devices",
    *DATA_FIELDS,
    *REWARD_FIELDS,
)
MAX_UPLOAD_BYTES = int(os.environ.get("RLWB_MAX_UPLOAD_MB") or 64) * 2**20


class InvalidLaunch(ValueError):
    """The form has problems; nothing was enqueued."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def dataset_choices(services: Services) -> list[str]:
    """Prompt sets (JSONL, JSON, CSV, Parquet) under the model roots and the data directory."""
    roots = (*services.model_roots, services.data_dir)
    return list(dict.fromkeys(str(path) for path in find_data_files(roots)))


def task_choices() -> list[tuple[str, str]]:
    return [(f"{name}: {description}", name) for name, description in api.TASKS.items()]


def reward_choices() -> list[str]:
    return [TASK_DEFAULT_REWARD, *api.REWARDS]


def environment_choices() -> list[tuple[str, str]]:
    """(label, value): single-turn, then every environment registered for multi-turn
    episodes."""
    names = sorted(api.registered_environments())
    return [("none: single-turn", SINGLE_TURN), *((name, name) for name in names)]


def upload_dataset(
    services: Services, file: str | None, prompt_column: str = "", answer_column: str = ""
) -> tuple[list[str], str | None, str]:
    """Keep an uploaded data file (JSONL, JSON, CSV, Parquet; its prompt and answer columns
    as the form names them, blank: automatic) in the data directory: (dataset choices, the
    stored path, a message). It is parsed once, here: Launch then finds its record count kept
    (`api.count_records`). A file that is not regular, over `MAX_UPLOAD_BYTES`, over the
    uploads' quota or unusable is refused and not kept; the upload is removed either way."""
    if not file:
        return dataset_choices(services), None, ""
    upload, stored = Path(file), None
    try:
        api.regular_file(upload, MAX_UPLOAD_BYTES)
        stored = save_upload(upload, services.data_dir)
        records = api.count_records(stored, _columns(prompt_column, answer_column))
    except (api.SpecError, api.UnsafeFileError, UploadRefused, OSError) as exc:
        if stored is not None:
            stored.unlink(missing_ok=True)
        why = _without_paths(str(exc), upload, stored)
        return dataset_choices(services), None, f"**Upload refused:** {inert(why)}"
    finally:
        upload.unlink(missing_ok=True)
    message = f"Stored {records} records as {inert(stored)}."
    return dataset_choices(services), str(stored), message


def _columns(prompt: str | None, answer: str | None) -> tuple[str | None, str | None]:
    return (prompt or "").strip() or None, (answer or "").strip() or None


def _without_paths(message: str, upload: Path, stored: Path | None) -> str:
    """An error message with the server's temporary upload path, and the stored copy's, replaced
    by the file's name (a temporary folder is nothing the user can act on, and none of their
    business)."""
    shown = {upload.resolve(): upload.name, upload: upload.name}
    if stored is not None:
        shown |= {stored.resolve(): upload.name, stored: upload.name}
    shown |= {upload.parent.resolve(): "…", upload.parent: "…"}
    for path, name in shown.items():
        message = message.replace(str(path), name)
    return message


def _check_model(services: Services, model: str | None, problems: list[str]) -> None:
    if not model:
        problems.append("model: choose the demo policy or a checkpoint")
    elif model not in api.MODEL_PRESETS:
        try:
            api.check_model(model, services.model_roots)
        except api.SpecError as exc:
            problems.append(str(exc))


def _check_data(
    services: Services,
    source: str,
    task: str | None,
    data: str | None,
    columns: tuple[str | None, str | None],
    problems: list[str],
) -> dict[str, str]:
    if source == TASK_SOURCE:
        if task not in api.TASKS:
            problems.append(f"task: choose one of {', '.join(api.TASKS)}")
            return {}
        return {"task": task}
    if not data:
        problems.append("data: choose or upload a data file")
        return {}
    try:
        api.check_data_file(data, (*services.model_roots, services.data_dir))
    except api.SpecError as exc:
        problems.append(str(exc))
        return {}
    try:
        api.count_records(data, columns)  # parsed once per version of the file, then remembered
    except api.SpecError as exc:
        problems.append(f"data: {exc}")
    return {"data": str(Path(data))}


def lr_for_mode(lora: bool, lr: float | str | None, model: str | None = None) -> float | str | None:
    """The learning rate the form shows when LoRA is switched on or off: the new mode's
    default for the chosen model (`api.mode_defaults`: 10x for LoRA on billion-scale models,
    1e-3 below 100M parameters) where it showed the other mode's, else as the user set it."""
    parameters = api.model_parameters(model) if model else None
    other = api.mode_defaults(not lora, parameters)["lr"]
    try:
        shown = parse_number(lr, "lr")
    except InvalidValue:
        return lr
    if shown is None or shown == other:
        return api.mode_defaults(lora, parameters)["lr"]
    return lr


def train_config(
    services: Services,
    model: str | None,
    source: str,
    task: str | None,
    data: str | None,
    reward: str | None,
    steps: float | str | None,
    batch_size: float | str | None,
    group_size: float | str | None,
    lr: float | str | None,
    temperature: float | str | None,
    top_p: float | str | None,
    max_tokens: float | str | None,
    max_policy_lag: float | str | None,
    kv_strategy: str,
    clip_eps: float | str | None,
    kl_coef: float | str | None,
    seed: float | str | None,
    updates_per_batch: float | str | None = 1,
    pipeline: str = SYNC,
    heldout_every: float | str | None = None,
    heldout_prompts: float | str | None = None,
    report_to: list[str] | None = None,
    lora: bool = False,
    lora_rank: float | str | None = None,
    lora_alpha: float | str | None = None,
    lora_dropout: float | str | None = None,
    lora_target_modules: list[str] | None = None,
    lora_modules_to_save: list[str] | None = None,
    environment: str | None = SINGLE_TURN,
    max_turns: float | str | None = None,
    max_episode_tokens: float | str | None = None,
    devices: float | str | None = 1,
    preset: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The training job's config from the form, or `InvalidLaunch` with every problem. The
    held-out settings apply to a built-in task (empty: the worker's defaults), or to a data
    file with a held-out fraction (`data_settings`); the LoRA settings when LoRA is on; an
    environment's episode limits when one is chosen, and then no reward (the environment
    scores); `preset`: an algorithm's (`api.ALGORITHM_PRESETS`; blank: none), which sets what
    the form has no field for; `more`: the `DATA_FIELDS` and the `REWARD_FIELDS`."""
    problems: list[str] = []
    _check_model(services, model, problems)
    config: dict[str, Any] = {"model": model}
    if preset:
        config["preset"] = preset  # checked with the job (`api.validate_job`)
    columns = _columns(more.get("prompt_column"), more.get("answer_column"))
    config.update(_check_data(services, source, task, data, columns, problems))
    if environment:
        config["environment"] = environment
        try:  # here, not with the other checks: its message is one problem, not a list
            api.check_environment(config)
        except api.SpecError as exc:
            problems.append(str(exc))
    else:
        config["reward"] = reward_config(reward, more, problems, max_tokens)
    numbers = {
        "steps": steps,
        "batch_size": batch_size,
        "group_size": group_size,
        "max_tokens": max_tokens,
        "max_policy_lag": max_policy_lag,
        "seed": seed,
        "updates_per_batch": updates_per_batch,
        "lr": lr,
        "temperature": temperature,
        "top_p": top_p,
        "clip_eps": clip_eps,
        "kl_coef": kl_coef,
        "devices": devices,  # ranks, one per device: more than a worker has is refused below
    }
    if environment:
        numbers |= {"max_turns": max_turns, "max_episode_tokens": max_episode_tokens}
    if source == TASK_SOURCE:
        heldout = {"heldout_every": heldout_every, "heldout_prompts": heldout_prompts}
        numbers |= {name: value for name, value in heldout.items() if value not in (None, "")}
    else:
        held = {"heldout_every": heldout_every, "heldout_prompts": heldout_prompts}
        config.update(data_settings({**more, **held}, problems))
    config.update({name: job_number(name, value, problems) for name, value in numbers.items()})
    if kv_strategy not in api.KV_STRATEGIES:
        problems.append(f"kv_strategy: choose one of {', '.join(api.KV_STRATEGIES)}")
    config["kv_strategy"] = kv_strategy
    config["pipeline"] = pipeline  # checked with the trainer's rules (`api.validate_job`)
    if report_to:
        config["report_to"] = list(report_to)
    targets, saved = lora_target_modules, lora_modules_to_save
    adapter = lora_table(lora, lora_rank, lora_alpha, lora_dropout, targets, saved, problems)
    if adapter is not None:
        config["lora"] = adapter
    if not problems:
        try:
            api.validate_job("train", {**config, "output_dir": OUTPUT_DIR_PLACEHOLDER})
            # as the worker reads them: a task's prompts (within the model's context?) and a
            # split data file's (anything left to train on?); a data file is otherwise read
            # once, by the submission (`api.submit_job`)
            if "task" in config or "heldout_fraction" in config:
                api.check_data_records(config)
        except api.SpecError as exc:
            problems.extend(str(exc).removeprefix("invalid training config: ").split("; "))
    if problems:
        raise InvalidLaunch(problems)
    return config


def launch_job(services: Services, **form: Any) -> str:
    """Validate the form (the keyword arguments of `train_config`) and enqueue a training job;
    returns a Markdown message: the new job, or every problem found (nothing is enqueued). A
    pipelined job asked with a max policy lag of 0 runs with 1 (`lag_for_pipeline`), said so."""
    lag = lag_for_pipeline(form.get("pipeline"), form.get("max_policy_lag"))
    try:
        config = train_config(services, **{**form, "max_policy_lag": lag})
        job = services.submit_job("train", config)
    except InvalidLaunch as exc:
        items = "\n".join(f"- {inert(problem)}" for problem in exc.problems)
        return f"**Nothing was enqueued.** Fix these first:\n{items}"
    except ValueError as exc:
        return f"**Nothing was enqueued:** {inert(exc)}"
    source = config.get("task") or config.get("data")
    what = f"train {inert(config['model'])} on {inert(source)}"
    if "environment" in config:
        what += f" in environment {inert(config['environment'])}"
    message = f"Job **#{job.id}** is {job.status.value}: {what}. Numbers used: "
    message += inert(numbers_used(config)) + "."
    if lag != form.get("max_policy_lag"):
        message += (
            f" Max policy lag raised to 1: pipeline {config['pipeline']} trains on samples "
            "generated one version before the trainer's."
        )
    return message + no_worker_warning(services)


def numbers_used(config: dict[str, Any]) -> str:
    """Every number of a job's config as the form read it ("steps 600, lr 0.0003, ..."): what
    each text field was taken to say."""
    numbers = {name: value for name, value in config.items() if name in api.JOB_FIELDS}
    lora = config.get("lora") or {}
    numbers |= {f"lora {k}": lora[k] for k in ("rank", "alpha", "dropout") if k in lora}
    for entry in config["reward"] if isinstance(config.get("reward"), list) else []:
        numbers[f"{entry['name']} weight"] = entry["weight"]
        if entry.get("threshold") is not None:
            numbers[f"{entry['name']} threshold"] = entry["threshold"]
    return ", ".join(f"{name} {value}" for name, value in numbers.items())


def no_worker_warning(services: Services) -> str:
    """A warning to append when no worker is online to run queued jobs (else "")."""
    if services.queue_overview().get("workers_online"):
        return ""
    return (
        "\n\n**No worker is online:** the job waits in the queue until one starts "
        "(`rlwb worker`, or the `worker` service of `docker compose up`)."
    )
