"""Training-job configuration (a JSON or TOML file, or keyword arguments)."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from core_engine.rl.rewards import check_reward_spec
from core_engine.task import KV_STRATEGIES, SamplingParams

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
OPTIMIZER_STATE_DTYPES = ("float32", "bfloat16")  # AdamW moments (core_engine.rl.optimizer)
DEVICE_TYPES = ("cpu", "cuda")


def torch_device_type(device: str) -> str:
    """'cpu', 'cuda' or 'cuda:N' -> its type; anything else is refused (syntax only: whether
    the device exists is checked where the job runs)."""
    kind, _, index = str(device).partition(":")
    if kind not in DEVICE_TYPES or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return kind


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
    keep_last: int = 3  # versions whose weights are kept (0: all); optimizer state: newest only
    keep_every: int = 25  # ... plus every version that is a multiple of this (0: none)
    kv_strategy: str = "paged"
    engine_batch_size: int = 128
    seed: int = 0
    resume: bool = True
    device: str = "cpu"  # trainer and engine
    engine_dtype: str = "auto"  # float32 | bfloat16 | float16 | auto (bf16 on CUDA, else fp32)
    tis_cap: float | None = None  # truncated IS cap; None: 2.0 when the engine dtype is not fp32
    max_tokens_per_micro_batch: int = 8192  # prompt + response tokens per training forward
    logit_chunk_rows: int = 256  # rows x vocabulary the log-softmax holds at once
    gradient_checkpointing: bool = False
    optimizer_state_dtype: str = "float32"  # AdamW's moments: float32 or bfloat16 (half)
    release_kv_during_training: bool = True  # the engine's KV memory is freed while training
    kv_cache_bytes: int | None = None  # the engine's KV budget (default: the engine's)
    gpu_memory_utilization: float | None = None  # on CUDA: the budget as a share of free memory

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
            "max_tokens_per_micro_batch",
            "logit_chunk_rows",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.lr <= 0:
            problems.append("lr must be > 0")
        sampling = SamplingParams(temperature=self.temperature, top_p=self.top_p)
        problems.extend(filter(None, [sampling.validation_error()]))
        if self.kv_strategy not in KV_STRATEGIES:
            problems.append(f"kv_strategy must be one of {', '.join(KV_STRATEGIES)}")
        if self.reject_scope not in ("batch", "group"):
            problems.append("reject_scope must be 'batch' or 'group'")
        if self.max_policy_lag < 0 or self.checkpoint_every < 0 or self.clip_eps <= 0:
            problems.append("max_policy_lag and checkpoint_every must be >= 0, clip_eps > 0")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            problems.append("kv_cache_bytes must be >= 1")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            problems.append("gpu_memory_utilization must be in (0, 1]")
        if self.keep_last < 0 or self.keep_every < 0:
            problems.append("keep_last and keep_every must be >= 0")
        if self.optimizer_state_dtype not in OPTIMIZER_STATE_DTYPES:
            problems.append(f"optimizer_state_dtype must be one of {list(OPTIMIZER_STATE_DTYPES)}")
        if self.engine_dtype not in ENGINE_DTYPES:
            problems.append(f"engine_dtype must be one of {sorted(ENGINE_DTYPES)}")
        if self.tis_cap is not None and not (math.isfinite(self.tis_cap) and self.tis_cap >= 0):
            problems.append("tis_cap must be a finite number >= 0 (0 turns it off)")
        if self.max_tokens >= self.max_tokens_per_micro_batch:
            problems.append(
                f"max_tokens_per_micro_batch ({self.max_tokens_per_micro_batch}) cannot hold one "
                f"sample: a prompt plus max_tokens ({self.max_tokens}) needs more"
            )
        try:
            torch_device_type(self.device)
        except ValueError as exc:
            problems.append(str(exc))
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
