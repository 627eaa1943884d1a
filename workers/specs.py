"""The settings of each job kind, as stored in the job row's ``config`` (plain JSON).

train: the fields of `core_engine.rl.config.GRPOConfig`; ``output_dir`` is optional (the
worker uses ``RLWB_DATA_DIR/jobs/<id>``) and ``model`` may be `DEMO_MODEL`. Worker-run jobs
always resume and save a checkpoint for every version (`checkpoint_every` = 1).
evaluate: ``job_id`` (a training job) + ``version``, or ``model``; and `EvalSettings` fields.
compare: ``job_id`` and ``versions`` (two of its versions); and `EvalSettings` fields.
Validation here imports no torch (the UI submits through `workers.api`).

What a job may ask of a worker: its sizes, and the files it names. Checked when a job is
submitted (`workers.api`, the UI, ``rlwb submit``) and again by the worker before it runs a
queued job, so a hand-made job row cannot bypass them.

Sizes (environment, defaults): ``RLWB_MAX_STEP_TOKENS`` prompts x group x max_tokens of one
step (4,194,304), ``RLWB_MAX_STEPS`` (1,000,000), ``RLWB_MAX_NEW_TOKENS`` per sample (32,768),
``RLWB_MAX_EVAL_PROMPTS`` (100,000). Files: a model must be a checkpoint directory under
``RLWB_MODEL_ROOTS`` (colon-separated; default the data dir), a JSONL file under those roots
or the data dir, an ``output_dir`` under the data dir; links are resolved first.
"""

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from core_engine.rl.config import GRPOConfig
from core_engine.rl.rewards import check_reward_spec
from core_engine.task import SamplingParams
from db import JobKind, data_dir
from workers.settings import Settings

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
        if self.num_prompts < 1:
            raise SpecError("num_prompts must be >= 1")
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
    held-out settings (`heldout_settings`) are the worker's, not the trainer's."""
    heldout_settings(config)
    trainer = {k: v for k, v in config.items() if k not in HELDOUT_KEYS}
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


_DEFAULTS = {
    "RLWB_MAX_STEP_TOKENS": 4_194_304,
    "RLWB_MAX_STEPS": 1_000_000,
    "RLWB_MAX_NEW_TOKENS": 32_768,
    "RLWB_MAX_EVAL_PROMPTS": 100_000,
}


def _limit(name: str) -> int:
    return int(os.environ.get(name) or _DEFAULTS[name])


def model_roots(default: Path | None = None) -> tuple[Path, ...]:
    """Where checkpoints may be read: ``RLWB_MODEL_ROOTS`` (colon-separated), default
    ``default`` (the data directory)."""
    raw = os.environ.get("RLWB_MODEL_ROOTS", "")
    roots = tuple(Path(part).expanduser() for part in raw.split(":") if part)
    return roots or (default or data_dir(),)


def is_under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` (resolved, links followed) lies inside one of ``roots``."""
    resolved = path.resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def _number(config: dict[str, Any], name: str, default: int) -> int:
    value = config.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def check_sizes(kind: JobKind | str, config: dict[str, Any]) -> None:
    """`SpecError` when the job is larger than a worker is set up to hold."""
    kind = JobKind(kind)
    tokens = _number(config, "max_tokens", 16 if kind is JobKind.TRAIN else 32)
    problems = []
    if tokens > _limit("RLWB_MAX_NEW_TOKENS"):
        problems.append(f"max_tokens {tokens} > {_limit('RLWB_MAX_NEW_TOKENS')}")
    if kind is JobKind.TRAIN:
        per_step = _number(config, "batch_size", 16) * _number(config, "group_size", 8) * tokens
        if per_step > _limit("RLWB_MAX_STEP_TOKENS"):
            problems.append(
                f"batch_size x group_size x max_tokens = {per_step} > "
                f"{_limit('RLWB_MAX_STEP_TOKENS')} tokens per step"
            )
        if _number(config, "steps", 50) > _limit("RLWB_MAX_STEPS"):
            problems.append(f"steps > {_limit('RLWB_MAX_STEPS')}")
    elif _number(config, "num_prompts", 64) > _limit("RLWB_MAX_EVAL_PROMPTS"):
        problems.append(f"num_prompts > {_limit('RLWB_MAX_EVAL_PROMPTS')}")
    if problems:
        raise SpecError("too large for the workers: " + "; ".join(problems))


def check_kv_budget(config: dict[str, Any], model_dir: Path) -> None:
    """`SpecError` when an explicit ``kv_cache_bytes`` is below the least one request can
    need: one prompt token plus ``max_tokens``, at 2 bytes per value (the engine's smallest
    dtype). The worker checks the exact need (real prompts, its dtype) at job start."""
    budget = config.get("kv_cache_bytes")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return
    try:
        model = json.loads((model_dir / "config.json").read_text())
        heads = model["num_attention_heads"]
        head_dim = model.get("head_dim") or model["hidden_size"] // heads
        kv_heads = model.get("num_key_value_heads") or heads
        per_token = 2 * model["num_hidden_layers"] * kv_heads * head_dim * 2
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return  # an unusual config: the worker's exact check decides
    tokens = 1 + _number(config, "max_tokens", 16)
    if budget < per_token * tokens:
        raise SpecError(
            f"kv_cache_bytes {budget:,} cannot hold one request: {tokens} tokens (1 prompt "
            f"token + max_tokens) x {per_token:,} bytes per token need {per_token * tokens:,}"
        )


def check_paths(config: dict[str, Any], settings: Settings) -> None:
    """`SpecError` unless every file the job names is one it may use (see the docstring)."""
    roots = model_roots(settings.data_dir)
    model = config.get("model")
    if isinstance(model, str) and model != DEMO_MODEL:
        path = Path(model)
        if not is_under(path, roots):
            raise SpecError(f"model: {model} is not under a model root (RLWB_MODEL_ROOTS)")
        if not (path / "config.json").is_file():
            raise SpecError(f"model: {model} has no config.json")
        check_kv_budget(config, path)
    data = config.get("data")
    if isinstance(data, str) and not is_under(Path(data), (*roots, settings.data_dir)):
        raise SpecError(f"data: {data} is not under a model root or the data directory")
    output = config.get("output_dir")
    if isinstance(output, str) and not is_under(Path(output), (settings.data_dir,)):
        raise SpecError(f"output_dir: {output} is not under the data directory")


# Held-out accuracy during training (`workers.evaluation.HeldoutEval`): every ``heldout_every``
# versions (default for a built-in task; 0 = off, the only choice for JSONL data) the colocated
# engine answers ``heldout_prompts`` held-out prompts of the job's task greedily; the accuracy
# is stored with the version (``heldout_accuracy`` among its metrics). These settings are the
# worker's, not the trainer's.
HELDOUT_EVERY = 10
HELDOUT_PROMPTS = 200
MAX_HELDOUT_PROMPTS = 2000
HELDOUT_KEYS = ("heldout_every", "heldout_prompts")
HELDOUT_METRIC = "heldout_accuracy"


@dataclass(frozen=True)
class HeldoutSettings:
    every: int
    prompts: int

    def due(self, version: int, last: int) -> bool:
        """Whether ``version`` is evaluated: every ``every``-th one, the first and the last."""
        return bool(self.every) and (version % self.every == 0 or version == last)


def heldout_settings(config: Mapping[str, Any]) -> HeldoutSettings:
    """The held-out settings of a train job's config (`SpecError` if they are unusable)."""
    default = HELDOUT_EVERY if config.get("task") is not None else 0
    every = config.get("heldout_every", default)
    prompts = config.get("heldout_prompts", HELDOUT_PROMPTS)
    for name, value in (("heldout_every", every), ("heldout_prompts", prompts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"{name} must be a whole number >= 0")
    if every and config.get("task") is None:
        raise SpecError("heldout_every needs a built-in task (held-out prompts come from it)")
    if not 1 <= prompts <= MAX_HELDOUT_PROMPTS:
        raise SpecError(f"heldout_prompts must be from 1 to {MAX_HELDOUT_PROMPTS}")
    return HeldoutSettings(every, prompts)
