"""Per-version checkpoints as Hugging Face directories, plus the optimizer state to resume.

`version-00012/` holds config.json, model.safetensors and the tokenizer (loadable by
`transformers`), `trainer_state.json` (version, step, optimizer scalars),
`optimizer.safetensors` (optimizer tensors) and, when the version was saved between two updates
of one rollout batch, `pending_rollout.json` (the rollout the next update reuses). Never pickle.

Retention (`prune_checkpoints`): the newest version keeps everything; older ones keep their
weights only if they are among the last `keep_last` or a multiple of `keep_every`, and never
their optimizer state.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from core_engine.weights import canonical_weights

COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


OPTIMIZER_FILE = "optimizer.safetensors"
PENDING_ROLLOUT = "pending_rollout.json"


def checkpoint_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"version-{version:05d}"


def save_checkpoint(
    root: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    version: int,
    step: int,
    source_dir: str | Path,
    extra: dict[str, Any] | None = None,
    pending_rollout: dict[str, Any] | None = None,
) -> Path:
    """Write version `version` atomically (a temporary directory renamed into place);
    `extra` joins the JSON trainer state."""
    final = checkpoint_dir(root, version)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().contiguous() for k, v in canonical_weights(model).items()}
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    for name in COPIED_FILES:
        if (Path(source_dir) / name).exists():
            shutil.copy(Path(source_dir) / name, tmp / name)
    tensors, scalars = _split_optimizer_state(optimizer.state_dict())
    save_file(tensors, tmp / OPTIMIZER_FILE)
    state = {"version": version, "step": step, "optimizer": scalars, **(extra or {})}
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    if pending_rollout is not None:
        (tmp / PENDING_ROLLOUT).write_text(json.dumps(pending_rollout))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def read_pending_rollout(path: str | Path) -> dict[str, Any] | None:
    file = Path(path) / PENDING_ROLLOUT
    return json.loads(file.read_text()) if file.is_file() else None


def prune_checkpoints(root: str | Path, keep_last: int, keep_every: int = 0) -> list[int]:
    """Apply the retention policy (module docstring); returns the versions whose weights were
    dropped. `keep_last` = 0 keeps every version's weights."""
    found = sorted(
        (read_trainer_state(p)["version"], p)
        for p in Path(root).glob("version-*")
        if not p.name.endswith(".tmp") and (p / "trainer_state.json").is_file()
    )
    dropped = []
    for rank, (version, path) in enumerate(reversed(found)):
        if rank == 0:
            continue
        (path / OPTIMIZER_FILE).unlink(missing_ok=True)
        (path / PENDING_ROLLOUT).unlink(missing_ok=True)
        kept = rank < keep_last or (keep_every and version % keep_every == 0) or not keep_last
        if not kept:
            shutil.rmtree(path)
            dropped.append(version)
    return sorted(dropped)


def latest_checkpoint(root: str | Path) -> Path | None:
    dirs = sorted(p for p in Path(root).glob("version-*") if (p / "trainer_state.json").exists())
    return dirs[-1] if dirs else None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "trainer_state.json").read_text())


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
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
    optimizer.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def _split_optimizer_state(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"state": {}, "param_groups": state_dict["param_groups"]}
    for index, fields in state_dict["state"].items():
        for field, value in fields.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{field}"] = value.detach().contiguous()
            else:
                scalars["state"].setdefault(str(index), {})[field] = value
    return tensors, scalars
