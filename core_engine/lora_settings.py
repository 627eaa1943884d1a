"""A job's LoRA settings (`lora` in a job file), checked without torch or PEFT so that the UI
and job submission can refuse bad ones; `core_engine.adapters` applies them. Also the file names
of a PEFT adapter directory, for readers without torch (the UI shows an adapter's size), and
its config as every loader reads it (`read_adapter_config`: the rank bounded as a job's is)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from core_engine.user_files import MAX_TEXT_BYTES, read_text

ALL_LINEAR = "all-linear"  # every projection of attention and MLP (not the LM head)
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SAVABLE_MODULES = ("lm_head", "embed_tokens")  # PEFT matches by suffix: "norm" would be all
MAX_RANK = 1024  # beyond any published LoRA recipe; bounds the adapter's size
MAX_ALPHA = 4096.0
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """A job's `lora` table. `target_modules`: "all-linear" or a list of `LINEAR_MODULES`;
    `modules_to_save`: whole modules trained and saved beside the adapter (`SAVABLE_MODULES`)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = ALL_LINEAR
    modules_to_save: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("target_modules", "modules_to_save"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = self._problems()
        if problems:
            raise ValueError("invalid lora settings: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LoraSettings:
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"invalid lora settings: unknown keys {unknown} (known: {known})")
        return cls(**values)

    def _problems(self) -> list[str]:
        problems = []
        if not _is_number(self.rank, integer=True) or not 1 <= self.rank <= MAX_RANK:
            problems.append(f"rank must be an integer from 1 to {MAX_RANK}, got {self.rank!r}")
        alpha = self.alpha
        if not _is_number(alpha) or not math.isfinite(alpha) or not 0 < alpha <= MAX_ALPHA:
            problems.append(f"alpha must be a number > 0 and <= {MAX_ALPHA:g}, got {alpha!r}")
        if not _is_number(self.dropout) or not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if targets != ALL_LINEAR and not _names_from(targets, LINEAR_MODULES):
            problems.append(
                f"target_modules must be {ALL_LINEAR!r} or a list of distinct names from "
                f"{list(LINEAR_MODULES)}, got {targets!r} (the LM head and the embedding "
                "are trained whole through modules_to_save)"
            )
        saved = self.modules_to_save
        if saved and not _names_from(saved, SAVABLE_MODULES):
            problems.append(
                f"modules_to_save must list distinct names from {list(SAVABLE_MODULES)}, "
                f"got {saved!r}"
            )
        return problems


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    """The ``adapter_config.json`` of a PEFT adapter directory (a regular file of bounded
    size), or ValueError unless it names its base (``base_model_name_or_path``) and each of
    its ranks (``r``, ``rank_pattern``) is an integer from 1 to `MAX_RANK`: a rank sizes
    the matrices a loader allocates."""
    path = Path(directory) / ADAPTER_CONFIG
    config = json.loads(read_text(path, MAX_TEXT_BYTES))
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path} names no base model (base_model_name_or_path)")
    patterns = config.get("rank_pattern") or {}
    ranks = [config.get("r"), *(patterns.values() if isinstance(patterns, dict) else [patterns])]
    for rank in ranks:
        if not _is_number(rank, integer=True) or not 1 <= rank <= MAX_RANK:
            raise ValueError(
                f"{path}: a rank must be an integer from 1 to {MAX_RANK}, got {rank!r}"
            )
    return config


def _is_number(value: object, integer: bool = False) -> bool:
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def _names_from(names: object, allowed: tuple[str, ...]) -> bool:
    return (
        isinstance(names, tuple)
        and bool(names)
        and len(set(names)) == len(names)
        and all(name in allowed for name in names)
    )
