"""The files a job names, checked when it is submitted and again by the worker before it runs
a queued job, without reading them (`core_engine.user_files`): a model must be a checkpoint
directory under ``RLWB_MODEL_ROOTS`` (colon-separated; default the data dir) holding only
regular files of bounded size, a data file (or saved dataset directory) of at most
`MAX_DATA_BYTES` under those roots or the data dir, an ``output_dir`` under the data dir;
links are resolved first. At submission the data are also read (`check_data_records`).
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import DataError
from core_engine.rl.dataset_files import load_records, split_heldout
from core_engine.user_files import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UnsafeFileError,
    checkpoint_dir,
    dataset_dir,
    is_under,
    read_text,
    regular_file,
)
from db import data_dir
from workers.settings import Settings
from workers.specs import DEMO_MODEL, SpecError, data_columns, heldout_settings


def model_roots(default: Path | None = None) -> tuple[Path, ...]:
    """Where checkpoints may be read: ``RLWB_MODEL_ROOTS`` (colon-separated), default
    ``default`` (the data directory)."""
    raw = os.environ.get("RLWB_MODEL_ROOTS", "")
    roots = tuple(Path(part).expanduser() for part in raw.split(":") if part)
    return roots or (default or data_dir(),)


def check_kv_budget(config: dict[str, Any], model_dir: Path) -> None:
    """`SpecError` when an explicit ``kv_cache_bytes`` is below the least one request can
    need: one prompt token plus ``max_tokens``, at 2 bytes per value (the engine's smallest
    dtype). The worker checks the exact need (real prompts, its dtype) at job start."""
    budget = config.get("kv_cache_bytes")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return
    try:
        model = json.loads(read_text(model_dir / "config.json", MAX_TEXT_BYTES))
        heads = model["num_attention_heads"]
        head_dim = model.get("head_dim") or model["hidden_size"] // heads
        kv_heads = model.get("num_key_value_heads") or heads
        per_token = 2 * model["num_hidden_layers"] * kv_heads * head_dim * 2
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return  # an unusual config: the worker's exact check decides
    tokens = 1 + config.get("max_tokens", GRPOConfig.max_tokens)
    if budget < per_token * tokens:
        raise SpecError(
            f"kv_cache_bytes {budget:,} cannot hold one request: {tokens} tokens (1 prompt "
            f"token + max_tokens) x {per_token:,} bytes per token need {per_token * tokens:,}"
        )


def check_model(model: str, roots: Sequence[Path]) -> Path:
    """The checkpoint directory ``model`` names, or `SpecError`: it must lie under ``roots``
    and hold only regular files of bounded size (`core_engine.user_files.checkpoint_dir`)."""
    if not is_under(Path(model), roots):
        raise SpecError(f"model: {model} is not under a model root (RLWB_MODEL_ROOTS)")
    try:
        return checkpoint_dir(model, roots)
    except UnsafeFileError as exc:
        raise SpecError(f"model: {exc}") from None


def check_data_file(data: str, roots: Sequence[Path], key: str = "data") -> None:
    """`SpecError` unless ``data`` is a regular file of at most `MAX_DATA_BYTES`, or a saved
    dataset directory of at most that, under ``roots`` (the model roots and the data
    directory); nothing is read."""
    if not is_under(Path(data), roots):
        raise SpecError(f"{key}: {data} is not under a model root or the data directory")
    try:
        if Path(data).is_dir():
            dataset_dir(data, MAX_DATA_BYTES, roots)
        else:
            regular_file(data, MAX_DATA_BYTES, roots)
    except UnsafeFileError as exc:
        raise SpecError(f"{key}: {exc}") from None


def check_data_records(config: dict[str, Any]) -> None:
    """`SpecError` naming the file and the column when the job's ``data`` or ``heldout_data``
    cannot be read as prompt records with its column mapping, or its held-out fraction leaves
    nothing to train on (read at submission; the paths are checked first by `check_paths`)."""
    columns, heldout = data_columns(config), heldout_settings(config)
    try:
        if isinstance(config.get("data"), str):
            records = load_records(config["data"], columns)
            if heldout.fraction is not None:
                split_heldout(records, heldout.fraction, config.get("seed", GRPOConfig.seed))
        if heldout.data is not None:
            load_records(heldout.data, columns)
    except DataError as exc:
        raise SpecError(str(exc)) from None


def check_paths(config: dict[str, Any], settings: Settings) -> None:
    """`SpecError` unless every file the job names is one it may use (see the docstring)."""
    roots = model_roots(settings.data_dir)
    model = config.get("model")
    if isinstance(model, str) and model != DEMO_MODEL:
        check_kv_budget(config, check_model(model, roots))
    for key in ("data", "heldout_data"):
        if isinstance(config.get(key), str):
            check_data_file(config[key], (*roots, settings.data_dir), key)
    output = config.get("output_dir")
    if isinstance(output, str) and not is_under(Path(output), (settings.data_dir,)):
        raise SpecError(f"output_dir: {output} is not under the data directory")
