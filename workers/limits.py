"""What a job may ask of a worker: its sizes, and the files it names. Checked when a job is
submitted (`workers.api`, the UI, ``rlwb submit``) and again by the worker before it runs a
queued job, so a hand-made job row cannot bypass them.

Sizes (environment, defaults): ``RLWB_MAX_STEP_TOKENS`` prompts x group x max_tokens of one
step (4,194,304), ``RLWB_MAX_STEPS`` (1,000,000), ``RLWB_MAX_NEW_TOKENS`` per sample (32,768),
``RLWB_MAX_EVAL_PROMPTS`` (100,000). Files: a model must be a checkpoint directory under
``RLWB_MODEL_ROOTS`` (colon-separated; default the data dir), a JSONL file under those roots
or the data dir, an ``output_dir`` under the data dir; links are resolved first.
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from db import JobKind, data_dir
from workers.settings import Settings
from workers.specs import DEMO_MODEL, SpecError

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
    data = config.get("data")
    if isinstance(data, str) and not is_under(Path(data), (*roots, settings.data_dir)):
        raise SpecError(f"data: {data} is not under a model root or the data directory")
    output = config.get("output_dir")
    if isinstance(output, str) and not is_under(Path(output), (settings.data_dir,)):
        raise SpecError(f"output_dir: {output} is not under the data directory")
