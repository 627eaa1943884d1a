"""The bounds of a training job that need no model: each numeric (and boolean) field's type and
range, in the one table that `GRPOConfig`, the worker's job checks and the Launch form all ask,
and the host memory one step's rollouts take (the batch part of the footprint rule;
`core_engine.rl.footprint.estimate` has the model part). No torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core_engine.task import MAX_TEMPERATURE, SEED_MAX, SEED_MIN

KIB, GIB = 2**10, 2**30
# Host memory per sample of one step, measured with tracemalloc on the default job's shapes:
# the rollout and its sample records (0.9 KiB) plus the peak of storing them in the step's one
# transaction (4.1 KiB, SQLite); and per prompt or response token: ids, two log-probs and text
# (112 B). A floor: the engine's per-request state and the trainer's tensors come on top.
SAMPLE_HOST_BYTES = 5 * KIB
TOKEN_HOST_BYTES = 112


@dataclass(frozen=True)
class Field:
    """A field's type (int, float or bool) and its range ``[low, high]`` (``(low, high]``
    with ``above_low``); ``optional``: None is allowed (the default decides)."""

    kind: type
    low: float = 0
    high: float = 0
    above_low: bool = False
    optional: bool = False

    def problem(self, name: str, value: Any) -> str | None:
        """Why ``value`` is not allowed for field ``name``, or None. An int field refuses a
        float (even 3.0), NaN and infinities; a bool is neither an int nor a float here."""
        if value is None and self.optional:
            return None
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{name} must be true or false"
        kinds = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            what = "a whole number" if self.kind is int else "a number"
            return f"{name} must be {what}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name} must be a finite number, got {value!r}"
        if value < self.low or (self.above_low and value == self.low):
            return f"{name} must be {'>' if self.above_low else '>='} {_show(self.low)}"
        if value > self.high:
            return f"{name} must be <= {_show(self.high)}"
        return None


def _show(bound: float) -> str:
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


def whole(low: int, high: int, optional: bool = False) -> Field:
    return Field(int, low, high, optional=optional)


def real(low: float, high: float, above_low: bool = False, optional: bool = False) -> Field:
    return Field(float, low, high, above_low, optional)


FLAG = Field(bool)
# The fields of `GRPOConfig` (its strings are checked there, against their lists of choices).
TRAINER_FIELDS: dict[str, Field] = {
    "steps": whole(1, 10**9),
    "batch_size": whole(1, 2**20),
    "group_size": whole(1, 2**16),
    "lr": real(0, 10.0, above_low=True),
    "weight_decay": real(0, 10.0),
    "max_grad_norm": real(0, 1e6, above_low=True),
    "temperature": real(0, MAX_TEMPERATURE),  # and 0 or >= MIN_TEMPERATURE: `SamplingParams`
    "top_p": real(0, 1.0, above_low=True),
    "max_tokens": whole(1, 2**20),
    "clip_eps": real(0, 10.0, above_low=True),
    "kl_coef": real(0, 1e3),
    "clip_eps_high": real(0, 100.0, above_low=True, optional=True),
    "clip_ratio_c": real(0, 1e6, above_low=True, optional=True),
    "delta": real(0, 1e6, above_low=True, optional=True),
    "sapo_temperature_pos": real(0, 1e3, above_low=True),
    "sapo_temperature_neg": real(0, 1e3, above_low=True),
    "mask_truncated_completions": FLAG,
    "entropy_coef": real(0, 10.0),
    "top_entropy_quantile": real(0, 1.0),
    "warmup_ratio": real(0, 1.0),
    "drop_zero_variance_groups": FLAG,
    "dynamic_sampling": FLAG,
    "max_sampling_draws": whole(1, 1000),
    "max_consecutive_rejections": whole(1, 10**6),
    "max_policy_lag": whole(0, 10**6),
    "max_turns": whole(1, 256),
    "max_episode_tokens": whole(2, 2**20),
    "updates_per_batch": whole(1, 1000),
    "checkpoint_every": whole(0, 10**9),
    "keep_last": whole(0, 10**6),
    "keep_every": whole(0, 10**9),
    "engine_batch_size": whole(1, 2**16),
    "devices": whole(1, 64),
    "collective_timeout_s": real(0.0, 7 * 86_400.0, above_low=True, optional=True),
    "rollout_timeout_s": real(0.0, 7 * 86_400.0, above_low=True, optional=True),
    "seed": whole(SEED_MIN, SEED_MAX),
    "resume": FLAG,
    "importance_cap": real(0, 1e6, above_low=True),
    "correct_on_policy": Field(bool, optional=True),
    "max_tokens_per_micro_batch": whole(1, 2**24),
    "logit_chunk_rows": whole(1, 2**20),
    "gradient_checkpointing": FLAG,
    "release_kv_during_training": FLAG,
    "kv_cache_bytes": whole(1, 2**50, optional=True),
    "gpu_memory_utilization": real(0, 1.0, above_low=True, optional=True),
}

# The numbers of one entry of a reward list (`core_engine.rl.rewards.mix`).
REWARD_TERM_FIELDS: dict[str, Field] = {
    "weight": real(-100.0, 100.0),
    "threshold": whole(0, 2**20),
    "max_length": whole(1, 2**20),
    "cache_length": whole(1, 2**20),
    "batch_size": whole(1, 4096),
}


def field_problems(values: Mapping[str, Any], table: Mapping[str, Field]) -> list[str]:
    """Every field of ``table`` present in ``values`` that its row refuses."""
    found = (row.problem(name, values[name]) for name, row in table.items() if name in values)
    return [problem for problem in found if problem]


def rollout_host_bytes(samples: int, tokens_per_sample: int) -> int:
    """The least host memory one step's rollouts take (see `SAMPLE_HOST_BYTES`)."""
    return samples * (SAMPLE_HOST_BYTES + tokens_per_sample * TOKEN_HOST_BYTES)


def describe_rollout_bytes(samples: int, tokens_per_sample: int) -> str:
    """The footprint of one step's rollouts in words, with its factors."""
    need = rollout_host_bytes(samples, tokens_per_sample)
    return (
        f"{need / GIB:.1f} GiB of host memory ({samples:,} samples x "
        f"({SAMPLE_HOST_BYTES // KIB} KiB + {tokens_per_sample:,} tokens x {TOKEN_HOST_BYTES} B))"
    )
