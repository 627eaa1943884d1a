"""Advantage estimators: a step's rewards [B, G] (B groups of G samples of one prompt) to one
advantage per sample, each a registered pure function (`ADVANTAGES`, the config's `advantage`).

Every estimator takes the rewards, the trained tokens of each sample [B, G] (0 for a sample not
trained on) and the settings, and returns [B, G]. A group whose rewards all agree (population
std below `EPS`) carries no learning signal: the group estimators give it exactly 0.

- `grpo` (DeepSeekMath; TRL's `scale_rewards`): r minus the group's mean, divided by the
  group's std (`group`, today's), the whole batch's (`batch`, PPO-Lite) or nothing (`none`),
  plus `EPS`; the std is the population std (`population`, today's) or torch.std's unbiased one
  (`unbiased`, TRL's `nanstd` and verl's choice). `EPS` is verl's 1e-6 (TRL adds 1e-4).
- `dr_grpo` (Dr. GRPO; verl's `norm_adv_by_std_in_grpo=False`): r minus the group's mean.
- `rloo` (RLOO; verl's `compute_rloo_outcome_advantage`): r minus the mean of the group's other
  samples, written as verl does: r * G / (G - 1) - mean * G / (G - 1).
- `reinforce_pp`: verl's `compute_reinforce_plus_plus_baseline_outcome_advantage` (REINFORCE++
  with a group baseline): r minus the group's mean, then whitened over the batch's trained
  tokens (`masked_whiten`: token-weighted mean and Bessel-corrected variance,
  (x - mean) * rsqrt(var + 1e-8)). The KL stays in the loss (`kl_coef`), not in the reward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from core_engine.rl.objective.choices import ADVANTAGE_ESTIMATORS, ADVANTAGE_STDS, SCALE_REWARDS
from core_engine.rl.objective.registry import Registry

EPS = 1e-6
WHITEN_EPS = 1e-8  # verl's masked_whiten


@dataclass(frozen=True)
class AdvantageSettings:
    estimator: str = "grpo"
    scale_rewards: str = "group"
    std: str = "population"

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("scale_rewards", self.scale_rewards, SCALE_REWARDS),
            ("advantage_std", self.std, ADVANTAGE_STDS),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")


Estimator = Callable[[torch.Tensor, torch.Tensor, AdvantageSettings], torch.Tensor]
ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", ADVANTAGE_ESTIMATORS)


def advantages(
    rewards: torch.Tensor, tokens: torch.Tensor, settings: AdvantageSettings = AdvantageSettings()
) -> torch.Tensor:
    """[B, G] advantages of `rewards` [B, G] by `settings.estimator`; `tokens`: each
    sample's trained tokens (0: not trained on)."""
    return ADVANTAGES[settings.estimator](rewards, tokens, settings)


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[B]: the groups whose rewards all agree (no learning signal, whatever the estimator)."""
    return rewards.std(dim=1, unbiased=False) < EPS


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, tokens: torch.Tensor, settings: AdvantageSettings) -> torch.Tensor:
    mean = rewards.mean(dim=1, keepdim=True)
    unbiased = settings.std == "unbiased"
    group_std = rewards.std(dim=1, unbiased=unbiased, keepdim=True)
    flat = torch.zeros_like(rewards)
    if settings.scale_rewards == "group":  # today's, operation for operation
        return torch.where(group_std < EPS, flat, (rewards - mean) / (group_std + EPS))
    centred = rewards - mean
    if settings.scale_rewards == "batch":
        centred = centred / (rewards.std(unbiased=unbiased) + EPS)
    return torch.where(zero_variance_groups(rewards)[:, None], flat, centred)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(
    rewards: torch.Tensor, tokens: torch.Tensor, settings: AdvantageSettings
) -> torch.Tensor:
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return torch.where(zero_variance_groups(rewards)[:, None], torch.zeros_like(rewards), centred)


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, tokens: torch.Tensor, settings: AdvantageSettings) -> torch.Tensor:
    g = rewards.shape[1]
    if g < 2:
        raise ValueError("RLOO needs at least 2 samples per group")
    mean = rewards.mean(dim=1, keepdim=True)
    return rewards * g / (g - 1) - mean * g / (g - 1)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(
    rewards: torch.Tensor, tokens: torch.Tensor, settings: AdvantageSettings
) -> torch.Tensor:
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    weights = tokens.to(centred.dtype)
    count = weights.sum()
    if count == 0:
        return centred
    mean = (centred * weights).sum() / count
    variance = ((centred - mean) ** 2 * weights).sum() / count
    if count > 1:
        variance = variance * count / (count - 1)
    return (centred - mean) * torch.rsqrt(variance + WHITEN_EPS)
