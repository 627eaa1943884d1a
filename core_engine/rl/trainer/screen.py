"""Which groups of a rollout may be trained on, why the others may not, and the samples an
update trains on."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from core_engine.rl.config import GRPOConfig
from core_engine.rl.objective.advantages import AdvantageSettings, advantages
from core_engine.rl.objective.update import TrainSample
from core_engine.rl.rollout.results import RawRollout, RolloutResult
from core_engine.rl.trainer.metrics import behaviour_lags


@dataclass(frozen=True)
class Screened:
    rejected: dict[int, str]  # group -> why it may not be trained on
    rejected_all: bool  # nothing of the batch may be trained on
    reasons: list[str]  # the problems found, one per faulty group


def screen_groups(rollout: RolloutResult, reject_scope: str) -> Screened:
    """A group with an errored, aborted or empty sample is never trained on; with
    `reject_scope="batch"` such a group rejects the whole batch. Dynamic sampling's filtered
    groups (`rollout.dynamic`) are rejected too, with their reason, rejecting nothing else."""
    rejected: dict[int, str] = {}
    for i, (reason, error, ids) in enumerate(
        zip(rollout.finish_reasons, rollout.errors, rollout.response_ids, strict=True)
    ):
        problem = None
        if reason in ("error", "abort"):
            problem = f"sample {i}: {reason}/{error.code.value}: {error.message}"
        elif not ids:
            problem = f"sample {i}: empty response"
        if problem:
            rejected.setdefault(rollout.group_of(i), problem)
    groups = len(rollout.prompt_ids)
    reasons = list(rejected.values())
    rejected_all = bool(rejected) and (reject_scope == "batch" or len(rejected) == groups)
    if rejected_all:
        rejected = {g: rejected.get(g, "rejected with its batch") for g in range(groups)}
    return Screened({**rollout.filtered_groups, **rejected}, rejected_all, reasons)


def untrained_reasons(rollout: RolloutResult) -> list[str]:
    """Why no group of a rollout that passed the screen is trained on: dynamic sampling's
    bound was hit (every group filtered, `rollout.dynamic`), or no group has reward variance."""
    filtered = rollout.filtered_groups
    if filtered and len(filtered) == len(rollout.prompt_ids):
        return list(dict.fromkeys(filtered.values()))
    return ["filtered: no trainable group (all have zero reward variance)"]


def trainable_rows(
    zero_variance: torch.Tensor, rejected: Collection[int], group_size: int, drop_zero: bool
) -> list[int]:
    """The samples an update trains on: those of groups neither rejected nor (with
    `drop_zero`) without reward variance."""
    trainable = torch.ones(len(zero_variance), dtype=torch.bool)
    trainable[list(rejected)] = False
    if drop_zero:
        trainable &= ~zero_variance
    return trainable.repeat_interleave(group_size).nonzero().squeeze(1).tolist()


def step_samples(
    rollout: RolloutResult,
    rewards: torch.Tensor,
    rows: list[int],
    proximal: Mapping[int, list[float]],
    trainer_version: int,
    config: GRPOConfig,
) -> tuple[list[float], list[TrainSample]]:
    """Every sample's advantage by the job's estimator (`objective.advantages`; the tokens
    each trains on weigh REINFORCE++'s whitening) and the `rows` as the update's samples. The
    estimator sees the step's batch: without dynamic sampling's filtered groups (0 for them),
    so a batch-wide scale is the kept groups' as in verl."""
    masked = config.mask_truncated_completions
    tokens = torch.tensor(trained_tokens(rollout, rows, masked)).view_as(rewards)
    settings = AdvantageSettings(config.advantage, config.scale_rewards, config.advantage_std)
    batch = [g for g in range(len(rewards)) if g not in rollout.filtered_groups]
    values = torch.zeros_like(rewards)
    values[batch] = advantages(rewards[batch], tokens[batch], settings)
    flat = values.view(-1).tolist()
    return flat, train_samples(rollout, rows, flat, proximal, trainer_version, masked)


def train_samples(
    rollout: RolloutResult,
    rows: list[int],
    advantages: list[float],
    proximal: Mapping[int, list[float]],
    trainer_version: int,
    mask_truncated: bool = False,
) -> list[TrainSample]:
    """The `rows` of `rollout` as the update's samples. `proximal`: the trainer's log-probs at
    the rollout's version where known (a reused rollout), else the update's own forward is
    pi_prox; a token is corrected when its behaviour log-prob depends on a version other than
    pi_prox's (`metrics.behaviour_lags`). `mask_truncated` (TRL's `mask_truncated_completions`):
    a sample that hit the length limit keeps no token in the loss (it still counts as a
    sequence of the step)."""
    return [
        TrainSample(
            rollout.prompt_ids[rollout.group_of(i)],
            rollout.response_ids[i],
            rollout.temp_logprobs[i],
            advantages[i],
            proximal.get(i),
            behaviour_lags(
                rollout, i, rollout.policy_version if i in proximal else trainer_version
            ),
            _loss_mask(rollout, i, mask_truncated),
        )
        for i in rows
    ]


def truncated(rollout: RawRollout, sample: int) -> bool:
    return rollout.finish_reasons[sample] == "length"


def _loss_mask(rollout: RolloutResult, sample: int, mask_truncated: bool) -> list[int] | None:
    if mask_truncated and truncated(rollout, sample):
        return [0] * len(rollout.response_ids[sample])
    return rollout.loss_masks[sample] if rollout.loss_masks else None


def trained_tokens(
    rollout: RolloutResult, rows: Collection[int], mask_truncated: bool
) -> list[int]:
    """Per sample of `rollout`, the tokens its loss keeps: 0 off `rows` (and, with
    `mask_truncated`, for a truncated sample)."""
    chosen = set(rows)
    return [
        sum(rollout.loss_mask_of(i))
        if i in chosen and not (mask_truncated and truncated(rollout, i))
        else 0
        for i in range(rollout.num_samples)
    ]
