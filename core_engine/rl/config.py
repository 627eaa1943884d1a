"""Training-job configuration (a JSON or TOML file, or keyword arguments)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from core_engine.rl.rewards import check_reward_spec


@dataclass(frozen=True)
class GRPOConfig:
    model: str  # local Hugging Face checkpoint directory
    output_dir: str
    task: str | None = None  # a built-in task name ...
    data: str | None = None  # ... or a JSONL file of records
    reward: str | None = None  # default: the task's reward, else exact_match
    steps: int = 50
    batch_size: int = 16  # prompts per rollout batch
    group_size: int = 8
    lr: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    drop_zero_variance_groups: bool = True
    reject_scope: str = "batch"  # "batch" or "group"
    max_consecutive_rejections: int = 5
    max_policy_lag: int = 0
    updates_per_batch: int = 1  # optimizer steps per batch of prompts (rollout reuse)
    checkpoint_every: int = 0  # 0: only the last version
    kv_strategy: str = "paged"
    engine_batch_size: int = 128
    seed: int = 0
    resume: bool = True
    device: str = "cpu"  # trainer and engine; both hold fp32 weights

    def __post_init__(self) -> None:
        problems = []
        if (self.task is None) == (self.data is None):
            problems.append("give exactly one of 'task' or 'data'")
        for name in (
            "steps",
            "batch_size",
            "group_size",
            "max_tokens",
            "engine_batch_size",
            "updates_per_batch",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.lr <= 0:
            problems.append("lr must be > 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            problems.append("temperature must be >= 0 and top_p in (0, 1]")
        if self.reject_scope not in ("batch", "group"):
            problems.append("reject_scope must be 'batch' or 'group'")
        if self.max_policy_lag < 0 or self.checkpoint_every < 0 or self.clip_eps <= 0:
            problems.append("max_policy_lag and checkpoint_every must be >= 0, clip_eps > 0")
        if self.reward is not None:
            try:
                check_reward_spec(self.reward)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config keys: {unknown}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> GRPOConfig:
        path = Path(path)
        text = path.read_text()
        values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
