"""The settings of each job kind, as stored in the job row's ``config`` (plain JSON).

train: the fields of `core_engine.rl.config.GRPOConfig`; ``output_dir`` is optional (the
worker uses ``RLWB_DATA_DIR/jobs/<id>``), ``model`` may name a shipped policy
(`workers.shipped`) and ``environment`` must be registered (`check_environment`).
Worker-run jobs always resume and save a checkpoint for every version (`checkpoint_every` = 1).
evaluate: ``job_id`` (a training job) + ``version``, or ``model``; and `EvalSettings` fields.
compare: ``job_id`` and ``versions`` (two of its versions); and `EvalSettings` fields.
Validation here imports no torch (the UI submits through `workers.api`).

What a job may ask of a worker: its sizes (`check_sizes`, limits in `workers.sizes`), its
devices (`device_problems`), the files it names in `workers.job_files`. Checked when a job is
submitted (`workers.api`, the UI, ``rlwb submit``) and again by the worker before it runs a
queued job, so a hand-made job row cannot bypass them.

Numbers: each field's type and range is a row of one table (`core_engine.rl.limits`,
`JOB_FIELDS`): an int field refuses floats, NaN and infinities.
"""

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from core_engine.rl.config import GRPOConfig, torch_device_type
from core_engine.rl.data.files import Columns
from core_engine.rl.data.tasks import default_reward
from core_engine.rl.episodes.environments import environment_target
from core_engine.rl.limits import TRAINER_FIELDS, Field, field_problems, real, whole
from core_engine.rl.rewards import check_reward_spec
from core_engine.rl.rewards.mix import needs_reference
from core_engine.task import SamplingParams
from db import JobKind
from workers.settings import worker_device
from workers.sizes import eval_size_problems, train_size_problems
from workers.trackers import TRACKERS, is_installed


class SpecError(ValueError):
    """A job configuration that cannot run."""


MAX_HELDOUT_PROMPTS = 2000
MAX_ID = 2**63 - 1  # a job id or a version: a database BIGINT
SAMPLING_FIELDS = ("seed", "temperature", "top_p", "max_tokens")
EVAL_FIELDS: dict[str, Field] = {
    "num_prompts": whole(1, 10**6),
    **{name: TRAINER_FIELDS[name] for name in SAMPLING_FIELDS},
}
MAX_HELDOUT_K = 64
HELDOUT_FIELDS: dict[str, Field] = {
    "heldout_every": whole(0, 10**6),
    "heldout_prompts": whole(1, MAX_HELDOUT_PROMPTS),
    "heldout_fraction": real(0, 0.5, above_low=True, optional=True),
    "heldout_k": whole(0, MAX_HELDOUT_K),
}
JOB_ID_FIELD, VERSION_FIELD = whole(1, MAX_ID), whole(0, MAX_ID)
# An evaluation names a job's version, or a model instead (then both are None).
ID_FIELDS: dict[str, Field] = {
    "job_id": replace(JOB_ID_FIELD, optional=True),
    "version": replace(VERSION_FIELD, optional=True),
}
# Every numeric field a job may set, for the Launch form (a train job's fields).
JOB_FIELDS: dict[str, Field] = {**TRAINER_FIELDS, **HELDOUT_FIELDS}


def _refuse_numbers(values: Mapping[str, Any], table: Mapping[str, Field]) -> None:
    problems = field_problems(values, table)
    if problems:
        raise SpecError("; ".join(problems))


@dataclass(frozen=True)
class EvalSettings:
    """The prompt set (a built-in task or a JSONL file) and how to sample on it."""

    task: str | None = None
    data: str | None = None
    num_prompts: int = 64
    # Seeds the built-in task's prompts and the sampling (the same for both versions of a
    # comparison). Training records use the train job's seed (default 0): pick another.
    seed: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 32
    reward: str | None = None

    def __post_init__(self) -> None:
        if (self.task is None) == (self.data is None):
            raise SpecError("give exactly one of 'task' or 'data'")
        _refuse_numbers(vars(self), EVAL_FIELDS)
        problem = self.sampling_params().validation_error()
        if problem:
            raise SpecError(problem)
        if self.reward is not None:
            try:
                check_reward_spec(self.reward)
            except ValueError as exc:
                raise SpecError(str(exc)) from None

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens
        )


@dataclass(frozen=True)
class EvaluateSpec:
    eval: EvalSettings
    job_id: int | None = None
    version: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        _refuse_numbers(vars(self), ID_FIELDS)
        if (self.model is None) == (self.job_id is None):
            raise SpecError("give either 'model' or 'job_id' (with 'version')")
        if self.job_id is not None and self.version is None:
            raise SpecError("'job_id' needs a 'version'")


@dataclass(frozen=True)
class CompareSpec:
    eval: EvalSettings
    job_id: int
    versions: tuple[int, int]

    def __post_init__(self) -> None:
        _refuse_numbers({"job_id": self.job_id}, {"job_id": JOB_ID_FIELD})
        for version in self.versions:
            _refuse_numbers({"versions": version}, {"versions": VERSION_FIELD})
        if len(self.versions) != 2 or self.versions[0] == self.versions[1]:
            raise SpecError("'versions' must be two different versions")


def _split(config: dict[str, Any], own: set[str]) -> tuple[dict[str, Any], EvalSettings]:
    eval_names = {f.name for f in fields(EvalSettings)}
    unknown = sorted(set(config) - own - eval_names)
    if unknown:
        raise SpecError(f"unknown config keys: {unknown}")
    settings = EvalSettings(**{k: v for k, v in config.items() if k in eval_names})
    return {k: v for k, v in config.items() if k in own}, settings


def train_config(config: dict[str, Any], output_dir: str) -> GRPOConfig:
    """The trainer's config for a worker-run job (checkpoint every version, resume); the
    held-out settings (`heldout_settings`) and the trackers (`report_to`) are the worker's,
    not the trainer's."""
    heldout_settings(config)
    data_columns(config)
    report_to(config)
    check_environment(config)
    worker_keys = (*HELDOUT_KEYS, *COLUMN_KEYS, REPORT_TO)
    trainer = {k: v for k, v in config.items() if k not in worker_keys}
    values = {"output_dir": output_dir, **trainer, "checkpoint_every": 1, "resume": True}
    try:
        return GRPOConfig.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise SpecError(str(exc)) from None


def check_environment(config: Mapping[str, Any]) -> None:
    """`SpecError` when a train job names an environment not registered here (the
    registry's `environment_target` says which are)."""
    name = config.get("environment")
    if name is None:
        return
    try:
        environment_target(name)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def evaluate_spec(config: dict[str, Any]) -> EvaluateSpec:
    own, settings = _split(config, {"job_id", "version", "model"})
    return EvaluateSpec(eval=settings, **own)


def compare_spec(config: dict[str, Any]) -> CompareSpec:
    own, settings = _split(config, {"job_id", "versions"})
    missing = sorted({"job_id", "versions"} - set(own))
    if missing:
        raise SpecError(f"missing config keys: {missing}")
    return CompareSpec(settings, own["job_id"], tuple(own["versions"]))


def validate(kind: JobKind | str, config: dict[str, Any]) -> int | None:
    """Check a job's config before it is queued; returns its total steps (if known)."""
    kind = JobKind(kind)
    if not isinstance(config, dict):
        raise SpecError("config must be a JSON object")
    try:
        if kind is JobKind.TRAIN:
            return train_config(config, config.get("output_dir", "unused")).steps
        if kind is JobKind.EVALUATE:
            evaluate_spec(config)
            return 1
        compare_spec(config)
        return 2
    except TypeError as exc:
        raise SpecError(str(exc)) from None


def check_sizes(kind: JobKind | str, config: dict[str, Any]) -> None:
    """`SpecError` when the job's fields are invalid (`validate`) or the job is larger than a
    worker is set up to hold (`workers.sizes`), the footprint of one step's rollouts included."""
    kind = JobKind(kind)
    validate(kind, config)  # types and ranges first: the sizes multiply numbers
    if kind is JobKind.TRAIN:
        trainer = train_config(config, "unused")
        samples = trainer.batch_size * trainer.group_size
        problems = train_size_problems(trainer.tokens_per_sample, samples, trainer.steps)
        problems.extend(device_problems(trainer.devices, config.get("device")))
    else:
        settings = (evaluate_spec if kind is JobKind.EVALUATE else compare_spec)(config).eval
        problems = eval_size_problems(settings.max_tokens, settings.num_prompts)
    if problems:
        raise SpecError("too large for the workers: " + "; ".join(problems))


def machine_devices(device_type: str) -> int | None:
    """The devices of `device_type` ("cpu" or "cuda") a worker has: ``RLWB_DEVICES`` when set
    (the operator's count, e.g. where the submitting host has no GPU), else this machine's: its
    cores on CPU; on CUDA torch's count when this process has loaded torch already (the worker,
    re-checking before it runs a job), else None (unknown: these checks never import torch,
    since the UI runs them, so the worker's re-check is the one that refuses)."""
    configured = os.environ.get("RLWB_DEVICES")
    if configured:
        return int(configured)
    if device_type == "cpu":
        return os.cpu_count() or 1
    torch = sys.modules.get("torch")
    return None if torch is None else torch.cuda.device_count()


def device_problems(devices: int, job_device: str | None) -> list[str]:
    """`devices` ranks need as many devices of the job's type (its own, else the worker's);
    one device is checked where the job runs, as before."""
    device_type = torch_device_type(job_device or worker_device())
    available = machine_devices(device_type)
    if devices == 1 or available is None or devices <= available:
        return []
    unit = "CPU cores" if device_type == "cpu" else "CUDA devices"
    return [f"devices = {devices} > the {available} {unit} a worker has (RLWB_DEVICES)"]


# Held-out evaluation during training (`workers.evaluation.HeldoutEval`): every
# ``heldout_every`` versions (default 10 with held-out prompts; 0 = off) the colocated engine
# answers ``heldout_prompts`` held-out prompts greedily, scored with the job's reward: their mean
# is stored with the version as ``heldout_accuracy`` (pass@1), and with ``heldout_k`` > 0 the
# mean reward of k samples at the job's temperature as ``heldout_mean_at_k``. Held-out prompts:
# a built-in task draws its own, a data job names a test file (``heldout_data``, read like
# ``data``) or holds back a seeded ``heldout_fraction`` (0 < f <= 0.5) of its records. These
# settings are the worker's, not the trainer's.
HELDOUT_EVERY = 10
HELDOUT_PROMPTS = 200
HELDOUT_KEYS = ("heldout_every", "heldout_prompts", "heldout_data", "heldout_fraction", "heldout_k")
HELDOUT_METRIC = "heldout_accuracy"
HELDOUT_MEAN_AT_K_METRIC = "heldout_mean_at_k"


@dataclass(frozen=True)
class HeldoutSettings:
    every: int
    prompts: int
    data: str | None = None
    fraction: float | None = None
    k: int = 0

    def due(self, version: int, last: int) -> bool:
        """Whether ``version`` is evaluated: every ``every``-th one, the first and the last."""
        return bool(self.every) and (version % self.every == 0 or version == last)


def heldout_settings(config: Mapping[str, Any]) -> HeldoutSettings:
    """The held-out settings of a train job's config (`SpecError` if they are unusable)."""
    data, fraction = config.get("heldout_data"), config.get("heldout_fraction")
    has_prompts = config.get("task") is not None or data is not None or fraction is not None
    every = config.get("heldout_every", HELDOUT_EVERY if has_prompts else 0)
    prompts = config.get("heldout_prompts", HELDOUT_PROMPTS)
    k = config.get("heldout_k", 0)
    numbers = {"heldout_every": every, "heldout_prompts": prompts, "heldout_k": k}
    _refuse_numbers({**numbers, "heldout_fraction": fraction}, HELDOUT_FIELDS)
    if data is not None and not isinstance(data, str):
        raise SpecError("heldout_data must be a file path")
    if data is not None and fraction is not None:
        raise SpecError("give one of 'heldout_data' or 'heldout_fraction'")
    if fraction is not None and config.get("data") is None:
        raise SpecError("heldout_fraction needs 'data' (a built-in task draws its own prompts)")
    if every and not has_prompts:
        raise SpecError(
            "heldout_every needs held-out prompts: a built-in task, 'heldout_data' or "
            "'heldout_fraction'"
        )
    return HeldoutSettings(every, prompts, data, fraction, k)


# How a data file's columns map to prompts (`core_engine.rl.data.files.Columns`): the
# worker's settings, not the trainer's, read with ``data`` and ``heldout_data`` alike.
COLUMN_KEYS = ("prompt_column", "answer_column", "system_prompt")


def data_columns(config: Mapping[str, Any]) -> Columns:
    """The column mapping of a job's config (`SpecError` if it is unusable); a reference
    answer is needed unless every reward of the job scores without one (`needs_reference`).
    An environment job always needs one: an environment may read the task's ``output`` and
    none says whether it does."""
    reward = config.get("reward") or default_reward(config.get("task"))
    columns = Columns(
        config.get("prompt_column"),
        config.get("answer_column"),
        config.get("system_prompt", ""),
        needs_answer=config.get("environment") is not None or needs_reference(reward),
    )
    problems = columns.problems()
    if problems:
        raise SpecError("; ".join(problems))
    return columns


# Experiment trackers (`workers.trackers`): ``report_to`` lists those a train job's versions are
# logged to (default none). The worker's setting, not the trainer's.
REPORT_TO = "report_to"


def report_to(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The trackers of a train job's config (`SpecError` unless a list of known names)."""
    names = config.get(REPORT_TO, [])
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise SpecError(f"report_to must be a list of tracker names ({', '.join(TRACKERS)})")
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise SpecError(
            f"report_to: unknown tracker {', '.join(map(repr, unknown))} "
            f"(choose from {', '.join(TRACKERS)})"
        )
    return tuple(dict.fromkeys(names))


def check_trackers_installed(config: Mapping[str, Any]) -> None:
    """`SpecError` when a tracker the job reports to is not installed here (checked when a job
    is submitted; a worker without it warns and trains on)."""
    missing = [name for name in report_to(config) if not is_installed(name)]
    if missing:
        raise SpecError(
            f"report_to: {', '.join(missing)} not installed: "
            f"pip install 'rl-workbench[{','.join(missing)}]'"
        )
