"""Per-version checkpoints as Hugging Face directories, plus the optimizer state to resume.

`version-00012/` holds config.json, model.safetensors and the tokenizer (loadable by
`transformers`); a LoRA run's holds its PEFT adapter instead of model.safetensors
(adapter_config.json naming the base + adapter_model.safetensors, `core_engine.adapters`;
config.json is the base's). Then `trainer_state.json` (version, step, optimizer scalars, a LoRA
run's base checksum), `optimizer.safetensors` (optimizer tensors; a sharded run's are in
`optimizer/`, each rank its own files: `core_engine.rl.ranks.state`) and, when the version was
saved between two updates of one rollout batch, `pending_rollout.json` (the rollout the next update
reuses). Never pickle.

Retention (`prune_checkpoints`): the newest version keeps everything; older ones keep their
weights only if they are among the last `keep_last` or a multiple of `keep_every`, or one of the
`span` versions after such a multiple (an `in_flight` run's samples stamped with it may hold
their tokens: its audit needs them, `GRPOConfig.sample_version_span`), and never their
optimizer state.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from core_engine.adapters import save_adapter
from core_engine.atomic_dir import Writer, atomic_dir, is_staging
from core_engine.weights import adapter_weights, save_weights

COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


OPTIMIZER_FILE = "optimizer.safetensors"
SHARDED_OPTIMIZER = "optimizer"  # a sharded run's: each rank its files (`ranks.state`)
PENDING_ROLLOUT = "pending_rollout.json"
TRAINING_STATE = ("trainer_state.json", OPTIMIZER_FILE, SHARDED_OPTIMIZER, PENDING_ROLLOUT)


def checkpoint_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"version-{version:05d}"


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole checkpoint (its trainer state is written last)."""
    return (path / "trainer_state.json").is_file()


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under ``root`` as (version, directory), oldest first."""
    found = [
        (read_trainer_state(path)["version"], path)
        for path in Path(root).glob("version-*")
        if not is_staging(path) and is_complete(path)
    ]
    return sorted(found)


def save_checkpoint(
    root: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    version: int,
    step: int,
    source_dir: str | Path,
    extra: dict[str, Any] | None = None,
    pending_rollout: dict[str, Any] | None = None,
    writer: Writer | None = None,
    sharded: Callable[[Path], None] | None = None,
) -> Path:
    """Write version `version` atomically (`core_engine.atomic_dir`, as ``writer``); `extra`
    joins the JSON trainer state. `sharded`: a sharded `model`'s weights and optimizer tensors
    written by every rank into the staging directory (`core_engine.rl.ranks.state`), instead of
    by this process."""
    final = checkpoint_dir(root, version)
    with atomic_dir(final, writer) as tmp:
        tensors, scalars = split_optimizer_state(optimizer.state_dict())
        if sharded is not None:
            sharded(tmp)
        elif adapter_weights(model):
            save_adapter(model, tmp, Path(source_dir).resolve())
        else:
            save_weights(model, tmp)
        for name in COPIED_FILES:
            if (Path(source_dir) / name).exists():
                shutil.copy(Path(source_dir) / name, tmp / name)
        if sharded is None:
            save_file(tensors, tmp / OPTIMIZER_FILE)
        state = {"version": version, "step": step, "optimizer": scalars, **(extra or {})}
        if pending_rollout is not None:
            (tmp / PENDING_ROLLOUT).write_text(json.dumps(pending_rollout))
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    return final


def read_pending_rollout(path: str | Path) -> dict[str, Any] | None:
    file = Path(path) / PENDING_ROLLOUT
    return json.loads(file.read_text()) if file.is_file() else None


def prune_checkpoints(
    root: str | Path, keep_last: int, keep_every: int = 0, span: int = 0
) -> list[int]:
    """Apply the retention policy (module docstring); returns the versions whose weights were
    dropped. `keep_last` = 0 keeps every version's weights."""
    dropped = []
    for rank, (version, path) in enumerate(reversed(list_checkpoints(root))):
        if rank == 0:
            continue
        (path / OPTIMIZER_FILE).unlink(missing_ok=True)
        shutil.rmtree(path / SHARDED_OPTIMIZER, ignore_errors=True)
        (path / PENDING_ROLLOUT).unlink(missing_ok=True)
        every = keep_every and version % keep_every <= span
        kept = rank < keep_last or every or not keep_last
        if not kept:
            shutil.rmtree(path)
            dropped.append(version)
    return sorted(dropped)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "trainer_state.json").read_text())


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    optimizer.load_state_dict(read_optimizer_state(path))


def read_optimizer_state(path: str | Path) -> dict[str, Any]:
    """The optimizer state a checkpoint keeps, as `optimizer.state_dict()` gives it."""
    scalars = read_trainer_state(path)["optimizer"]
    file = Path(path) / OPTIMIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no optimizer state: only the newest version keeps it")
    tensors = load_file(file)
    state: dict[int, dict[str, Any]] = {}
    for key, value in scalars["state"].items():
        state[int(key)] = dict(value)
    for name, tensor in tensors.items():
        index, field = name.split(".", 1)
        state.setdefault(int(index), {})[field] = tensor
    return {"state": state, "param_groups": scalars["param_groups"]}


def split_optimizer_state(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`optimizer.state_dict()` as its tensors, keyed "index.field", and its JSON scalars."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"state": {}, "param_groups": state_dict["param_groups"]}
    for index, fields in state_dict["state"].items():
        for field, value in fields.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{field}"] = value.detach().contiguous()
            else:
                scalars["state"].setdefault(str(index), {})[field] = value
    return tensors, scalars
