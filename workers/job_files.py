"""The files a job names, checked when it is submitted and again by the worker before it runs
a queued job, without reading them (`core_engine.user_files`): a model must be a checkpoint
directory under ``RLWB_MODEL_ROOTS`` (colon-separated; default the data dir) holding only
regular files of bounded size, a data file (or saved dataset directory) of at most
`MAX_DATA_BYTES` under those roots or the data dir, an ``output_dir`` under the data dir;
links are resolved first. At submission the data are also read (`check_data_records`), and
the prompts must fit the model's context with ``max_tokens`` (`check_prompt_room`).
"""

import json
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from core_engine.assets import SHIPPED_POLICY
from core_engine.rl.config import GRPOConfig, approx_parameters
from core_engine.rl.data import DataError, longest_prompt, longest_records
from core_engine.rl.data.files import load_records, split_heldout
from core_engine.rl.data.tasks import prompt_records
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
from workers.chat import checkpoint_context
from workers.settings import Settings
from workers.specs import DEMO_MODEL, SpecError, data_columns, heldout_settings

PROMPTS_CHECKED = 64  # the records of the longest prompts (characters) rendered at submission


class DemoPolicyMissing(FileNotFoundError):
    """The shipped demo policy is not where the package keeps it."""


def resolve_model(model: str) -> str:
    """The checkpoint directory for ``model``: `DEMO_MODEL` is the policy shipped in the
    repository (`core_engine.assets.SHIPPED_POLICY`), anything else a directory."""
    if model != DEMO_MODEL:
        return model
    if not (SHIPPED_POLICY / "config.json").is_file():
        raise DemoPolicyMissing(
            f"the demo policy is missing from {SHIPPED_POLICY}: rebuild it with "
            "`python -m core_engine.rl.demo_policy` (make demo-policy)"
        )
    return str(SHIPPED_POLICY)


def model_parameters(model: str) -> int | None:
    """The parameter count of ``model`` (`DEMO_MODEL` or a checkpoint directory), None when
    it cannot be read: what the LoRA learning-rate default depends on."""
    try:
        return approx_parameters(resolve_model(model))
    except DemoPolicyMissing:
        return None


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
    cannot be read as prompt records with its column mapping, its held-out fraction leaves
    nothing to train on, or its prompts (a built-in task's as the worker draws them) do not
    fit the model's context (`check_prompt_room`). Read at submission; the paths are checked
    first (`check_paths`)."""
    columns, heldout = data_columns(config), heldout_settings(config)
    seed = config.get("seed", GRPOConfig.seed)
    try:
        if isinstance(config.get("data"), str):
            records = load_records(config["data"], columns)
            if heldout.fraction is not None:
                split_heldout(records, heldout.fraction, seed)
            check_prompt_room(config, records, config["data"])
        elif isinstance(config.get("task"), str):
            records = prompt_records(config["task"], None, seed=seed)
            check_prompt_room(config, records, f"task {config['task']}")
        if heldout.data is not None:
            check_prompt_room(config, load_records(heldout.data, columns), heldout.data)
    except DataError as exc:
        raise SpecError(str(exc)) from None


def check_prompt_room(
    config: Mapping[str, Any], records: Sequence[Mapping[str, str]], source: str
) -> None:
    """`SpecError` when the longest prompt of ``records`` (among the `PROMPTS_CHECKED` of the
    most characters), rendered with the model's chat template as the trainer renders it, and
    ``max_tokens`` do not fit the model's context (``max_position_embeddings``): the engine
    would refuse the prompt (``prompt_too_long``) or cut its responses short. A checkpoint
    without a stated context or a tokenizer that loads is left to the worker."""
    try:
        model = Path(resolve_model(config["model"]))
    except DemoPolicyMissing:
        return  # the worker says so
    context = checkpoint_context(model)
    tokenizer = _model_tokenizer(model) if context else None
    if tokenizer is None:
        return
    try:
        longest = longest_prompt(tokenizer, longest_records(records, PROMPTS_CHECKED))
    except Exception:  # a template this tokenizer cannot render: the worker's is the word
        return
    max_tokens = config.get("max_tokens", GRPOConfig.max_tokens)
    if longest + max_tokens > context:
        raise SpecError(
            f"prompts too long for the model: the longest prompt of {source} is {longest} "
            f"tokens (with the model's chat template) and max_tokens is {max_tokens}: "
            f"{longest + max_tokens} tokens do not fit the model's {context}-token context "
            "(max_position_embeddings in its config.json)"
        )


def _model_tokenizer(model: Path) -> Any | None:
    """The checkpoint's tokenizer as the trainer loads it, kept while the directory's files
    are unchanged; None when it has none that loads."""
    try:
        files = sorted(path for path in model.iterdir() if path.is_file())
        identity = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
        return _load_tokenizer(str(model), identity)
    except Exception:  # no tokenizer there: the worker says what is missing
        return None


@lru_cache(maxsize=4)
def _load_tokenizer(model: str, identity: tuple[tuple[str, int, int], ...]) -> Any:
    # `transformers` imports torch: here, at the first check, never when this module is
    # imported. A tokenizer loaded otherwise (`PreTrainedTokenizerFast`) can count differently
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=True)


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
