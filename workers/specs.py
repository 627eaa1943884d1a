"""The settings of each job kind, as stored in the job row's ``config`` (plain JSON).

train: the fields of `core_engine.rl.config.GRPOConfig`; ``output_dir`` is optional (the
worker uses ``RLWB_DATA_DIR/jobs/<id>``) and ``model`` may be `DEMO_MODEL`. Worker-run jobs
always resume and save a checkpoint for every version (`checkpoint_every` = 1).
evaluate: ``job_id`` (a training job) + ``version``, or ``model``; and `EvalSettings` fields.
compare: ``job_id`` and ``versions`` (two of its versions); and `EvalSettings` fields.
Validation here imports no torch (the UI submits through `workers.api`).
"""

from dataclasses import dataclass, fields
from typing import Any

from core_engine.rl.config import GRPOConfig
from core_engine.rl.rewards import check_reward_spec
from db import JobKind

DEMO_MODEL = "demo"  # the built-in demo policy, built by the worker on first use


class SpecError(ValueError):
    """A job configuration that cannot run."""


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
        if self.num_prompts < 1 or self.max_tokens < 1:
            raise SpecError("num_prompts and max_tokens must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise SpecError("temperature must be >= 0 and top_p in (0, 1]")
        if self.reward is not None:
            try:
                check_reward_spec(self.reward)
            except ValueError as exc:
                raise SpecError(str(exc)) from None


@dataclass(frozen=True)
class EvaluateSpec:
    eval: EvalSettings
    job_id: int | None = None
    version: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
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
    held-out settings (`workers.heldout`) are the worker's, not the trainer's."""
    from workers.heldout import KEYS, heldout_settings

    heldout_settings(config)
    trainer = {k: v for k, v in config.items() if k not in KEYS}
    values = {"output_dir": output_dir, **trainer, "checkpoint_every": 1, "resume": True}
    try:
        return GRPOConfig.from_dict(values)
    except (TypeError, ValueError) as exc:
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
