"""The files a job names, checked when it is submitted and again by the worker before it runs
a queued job, without reading them (`core_engine.user_files`): a model must be a checkpoint
directory under ``RLWB_MODEL_ROOTS`` (colon-separated; default the data dir) or one the package
ships (the demo policies, by path too) holding only regular files of bounded size, a data file
(or saved dataset directory) of at most `MAX_DATA_BYTES` under those roots or the data dir, an
``output_dir`` under the data dir; links are resolved first. At submission the data are also
read (`check_data_records`), and the prompts must fit the model's context with ``max_tokens``
(`check_prompt_room`). A model that is a PEFT adapter has bounded ranks and a base that passes
the same check (`check_adapter_base`); an ``output_dir`` keeps apart from the data dir itself,
the jobs' default folders and every earlier job's output folder (`check_output_dir`).
"""

import json
import os
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from core_engine.assets import SHIPPED_POLICY
from core_engine.lora_settings import ADAPTER_CONFIG, read_adapter_config
from core_engine.rl.config import GRPOConfig, approx_parameters
from core_engine.rl.data import DataError, longest_prompt, longest_records
from core_engine.rl.data.files import load_records, split_heldout
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.rewards.reward_model import (
    REWARD_MODEL,
    check_reward_model,
    reward_model_paths,
    with_reward_models,
)
from core_engine.rl.template_sandbox import TemplateBoundError
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
from db import Repository, data_dir
from workers import hub
from workers.chat import checkpoint_context
from workers.settings import Settings
from workers.shipped import SHIPPED_MODEL_NAMES, shipped_policy
from workers.specs import SpecError, data_columns, heldout_settings

PROMPTS_CHECKED = 64  # the records of the longest prompts (characters) rendered at submission
SHIPPED_MODELS = SHIPPED_POLICY.parent  # the checkpoints the package ships: always allowed


class DemoPolicyMissing(FileNotFoundError):
    """A shipped demo policy is not where the package keeps it."""


def resolve_model(model: str, download: Callable[[str], None] | None = None) -> str:
    """The checkpoint directory for ``model``: a shipped model name (`SHIPPED_MODEL_NAMES`) is
    the policy shipped in the repository (`shipped_policy`); a Hugging Face Hub id
    (`workers.hub.is_hub_id`) its snapshot in the Hugging Face cache, downloaded first when
    ``download`` is given (told how far it is), else the id until it is there; anything else a
    directory."""
    if model in SHIPPED_MODEL_NAMES:
        path, builder = shipped_policy(model)
        if not (path / "config.json").is_file():
            raise DemoPolicyMissing(
                f"the {model} policy is missing from {path}: rebuild it with `python -m {builder}`"
            )
        return str(path)
    if hub.is_hub_id(model) and download is not None:
        return str(hub.download(model, download))
    if hub.is_hub_id(model):
        return str(hub.cached_snapshot(model) or model)
    return model


def check_reward_models(reward: Any, roots: Sequence[Path]) -> None:
    """`SpecError` unless each reward model of ``reward`` passes `check_model` and is a reward
    model this worker can load (`check_reward_model`; a Hub id the worker is yet to download
    is checked when it has it)."""
    for model in reward_model_paths(reward):
        try:
            checkpoint = check_model(model, roots)
            if checkpoint is not None:
                check_reward_model(checkpoint)
        except (SpecError, ValueError) as exc:
            raise SpecError(f"reward {REWARD_MODEL}: {exc}") from None


def model_parameters(model: str) -> int | None:
    """The parameter count of ``model`` (a shipped model name or a checkpoint directory), None when
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


def _outside(problem: str, roots: Sequence[Path]) -> SpecError:
    listed = ", ".join(str(root) for root in dict.fromkeys(roots))
    add = "set RLWB_MODEL_ROOTS (colon-separated) before starting the workbench, or copy it there"
    return SpecError(f"{problem}; allowed: {listed}; to allow another directory, {add}")


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


def check_model(model: str, roots: Sequence[Path]) -> Path | None:
    """The checkpoint directory ``model`` names, or `SpecError`: it must lie under ``roots``
    or be one the package ships (`SHIPPED_MODELS`, wherever the workbench runs), and hold only
    regular files of bounded size (`core_engine.user_files.checkpoint_dir`). A Hugging Face Hub
    id must be one this machine can have (`workers.hub.check_hub_model`): its cached snapshot,
    None while the worker is yet to download it."""
    if hub.is_hub_id(model):
        return hub.check_hub_model(model)
    allowed = (*roots, SHIPPED_MODELS)
    if not is_under(Path(model), allowed):
        raise _outside(f"model: {model} is not under a model root", roots)
    try:
        return checkpoint_dir(model, allowed)
    except UnsafeFileError as exc:
        raise SpecError(f"model: {exc}") from None


def check_adapter_base(checkpoint: Path, model: str, roots: Sequence[Path]) -> None:
    """`SpecError` when the checkpoint of ``model`` is a PEFT adapter, which is loaded on the
    base it names, whose ranks are out of bounds (`read_adapter_config`) or whose base fails
    `check_model` or is an adapter itself."""
    if not (checkpoint / ADAPTER_CONFIG).is_file():
        return
    try:
        base = read_adapter_config(checkpoint)["base_model_name_or_path"]
    except ValueError as exc:
        raise SpecError(f"model: {exc}") from None
    try:
        base_checkpoint = check_model(base, roots)
    except SpecError as exc:
        problem = str(exc).removeprefix("model: ")
        raise SpecError(f"model: the base of the adapter {model}: {problem}") from None
    if base_checkpoint is not None and (base_checkpoint / ADAPTER_CONFIG).is_file():
        raise SpecError(f"model: the base of the adapter {model}, {base}, is an adapter too")


def check_data_file(data: str, roots: Sequence[Path], key: str = "data") -> None:
    """`SpecError` unless ``data`` is a regular file of at most `MAX_DATA_BYTES`, or a saved
    dataset directory of at most that, under ``roots`` (the model roots and the data
    directory); nothing is read."""
    if not is_under(Path(data), roots):
        raise _outside(f"{key}: {data} is not under a model root or the data directory", roots)
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
    fit the model's context (`check_prompt_room`), nor an environment job's episodes
    (`check_episode_room`). Read at submission; the paths are checked first (`check_paths`)."""
    check_episode_room(config)
    columns, heldout = data_columns(config), heldout_settings(config)
    seed = config.get("seed", GRPOConfig.seed)
    try:
        if isinstance(config.get("data"), str):
            records = load_records(config["data"], columns)
            if heldout.fraction is not None:
                split_heldout(records, heldout.fraction, seed)
            check_prompt_room(config, records, config["data"])
        elif isinstance(config.get("task"), str):
            records = prompt_records(config["task"], None, seed=seed, columns=columns)
            check_prompt_room(config, records, f"task {config['task']}")
        if heldout.data is not None:
            check_prompt_room(config, load_records(heldout.data, columns), heldout.data)
    except DataError as exc:
        raise SpecError(str(exc)) from None


def check_episode_room(config: Mapping[str, Any]) -> None:
    """`SpecError` when an environment job's episodes (``max_episode_tokens``: the prompt,
    every turn and observation) cannot fit the model's context (``max_position_embeddings``):
    its long episodes would end ``context_exceeded`` or be refused by the engine."""
    if config.get("environment") is None:
        return
    try:
        context = checkpoint_context(resolve_model(config["model"]))
    except DemoPolicyMissing:
        return  # the worker says so
    tokens = config.get("max_episode_tokens", GRPOConfig.max_episode_tokens)
    if context is not None and isinstance(tokens, int) and tokens > context:
        raise SpecError(
            f"max_episode_tokens ({tokens}) exceeds the model's {context}-token context "
            f"(max_position_embeddings in its config.json): set max_episode_tokens <= {context}"
        )


def check_prompt_room(
    config: Mapping[str, Any], records: Sequence[Mapping[str, str]], source: str
) -> None:
    """`SpecError` when the longest prompt of ``records`` (among the `PROMPTS_CHECKED` of the
    most characters), rendered with the model's chat template as the trainer renders it, and
    ``max_tokens`` do not fit the model's context (``max_position_embeddings``): the engine
    would refuse the prompt (``prompt_too_long``) or cut its responses short; or when the
    template breaks a bound of its child (`core_engine.rl.template_sandbox`: time, memory,
    length). A checkpoint without a stated context or a tokenizer that loads is left to the
    worker."""
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
    except TemplateBoundError as exc:  # rendered in a bounded child: past a bound here
        raise SpecError(str(exc)) from None
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


def absolute_paths(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its relative paths made absolute from the directory it is submitted in
    (the worker may run in another); a ``model`` that is no local path (a shipped name, a Hub
    id) stays as it is."""
    paths = {}
    for key in ("model", "data", "heldout_data", "output_dir"):
        value = config.get(key)
        if not isinstance(value, str) or not value or os.path.isabs(value):
            continue
        if key != "model" or (value not in SHIPPED_MODEL_NAMES and Path(value).exists()):
            paths[key] = os.path.abspath(value)
    if reward_model_paths(config.get("reward")):  # a reward model's as a model's
        paths["reward"] = with_reward_models(config["reward"], _absolute_if_local)
    return {**config, **paths}


def _absolute_if_local(path: str) -> str:
    return os.path.abspath(path) if Path(path).exists() else path


def check_paths(config: dict[str, Any], settings: Settings) -> None:
    """`SpecError` unless every file the job names is one it may use (see the docstring)."""
    roots = model_roots(settings.data_dir)
    model = config.get("model")
    if isinstance(model, str) and model not in SHIPPED_MODEL_NAMES:
        checkpoint = check_model(model, roots)
        if checkpoint is not None:
            check_adapter_base(checkpoint, model, roots)
            check_kv_budget(config, checkpoint)
    check_reward_models(config.get("reward"), roots)
    for key in ("data", "heldout_data"):
        if isinstance(config.get(key), str):
            check_data_file(config[key], (*roots, settings.data_dir), key)
    output = config.get("output_dir")
    if isinstance(output, str) and not is_under(Path(output), (settings.data_dir,)):
        raise SpecError(f"output_dir: {output} is not under the data directory")


def job_output_dir(job_id: int, config: Mapping[str, Any], settings: Settings) -> Path:
    """A train job's checkpoint folder: its ``output_dir``, else ``jobs/<id>`` in the data dir."""
    return Path(config.get("output_dir") or settings.jobs_dir / str(job_id))


def check_output_dir(
    config: Mapping[str, Any], settings: Settings, repo: Repository, job_id: int | None = None
) -> None:
    """`SpecError` when the ``output_dir`` of job ``job_id`` (None: a job not yet created) is
    the data directory or holds it, lies in a folder the workbench writes itself
    (`Settings.own_dirs`), or is inside an earlier job's output folder or holds one: a job
    starts by cleaning its folder (`workers.training.reconcile`), which would delete another
    job's checkpoints. The folder belongs to the first job that names it."""
    output = config.get("output_dir")
    if not isinstance(output, str) or not output:
        return
    mine = Path(output).resolve()
    if settings.data_dir.resolve().is_relative_to(mine):
        raise SpecError(f"output_dir: {output} is the data directory or holds it")
    for folder, what in settings.own_dirs.items():
        if mine.is_relative_to(folder.resolve()):
            raise SpecError(f"output_dir: {output} is inside {folder}, {what}")
    for other, folder in sorted(repo.output_dirs().items()):
        if job_id is not None and other >= job_id:
            continue
        theirs = Path(folder).resolve()
        if mine.is_relative_to(theirs) or theirs.is_relative_to(mine):
            raise SpecError(f"output_dir: {output} overlaps job {other}'s output folder {folder}")
