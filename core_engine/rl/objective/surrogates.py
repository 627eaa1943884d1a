"""Policy losses and importance-ratio levels, each a registered pure function.

`RATIOS` (the config's `importance_sampling_level`): the log importance ratio per token [N, T]
from the current log-probs and each token's denominator (`loss` picks pi_prox or mu), zero off
the mask:

- `token`: log pi_theta - log denominator, per token (PPO, GRPO).
- `sequence` (GSPO; TRL's "sequence"): the sequence's mean token log-ratio, every token of the
  sequence sharing it (TRL: sum(log_ratio * mask) / clamp(sum(mask), 1)).
- `sequence_token` (GSPO-token; verl's `gspo`): sg[sequence log-ratio] + log pi_theta -
  sg[log pi_theta], clamped at 10 as verl does: the sequence's value, each token's gradient.

`POLICY_LOSSES` (the config's `policy_loss`): per-token losses [N, T] from the ratio r, the
current log-probs and the advantages [N, 1], with named boolean token masks whose token means
are recorded (TRL's metric names):

- `ppo_clip`: -min(r A, clip(r, 1 - clip_eps, 1 + clip_eps_high) A) (DAPO's clip-higher when
  the two differ); with `delta`, r in the first term is min(r, delta) (TRL's two-sided clip,
  INTELLECT-2); with `clip_ratio_c`, tokens with A < 0 lose at most -c A (verl's dual clip).
- `cispo` (MiniMax-M1, as TRL): -sg[min(r, clip_eps_high)] A log pi_theta.
- `sapo` (TRL): -sigmoid(tau (r - 1)) 4 / tau A, tau = `sapo_temperature_pos` where A > 0,
  else `sapo_temperature_neg`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from core_engine.rl.objective.choices import IMPORTANCE_SAMPLING_LEVELS
from core_engine.rl.objective.choices import POLICY_LOSSES as POLICY_LOSS_NAMES
from core_engine.rl.objective.clip import clipped_high, clipped_low
from core_engine.rl.objective.registry import Registry
from core_engine.rl.objective.settings import Objective

GSPO_TOKEN_LOG_RATIO_MAX = 10.0  # verl's clamp, "for numerical stability"

RatioLevel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
RATIOS: Registry[RatioLevel] = Registry("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)

PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, Objective],
    tuple[torch.Tensor, dict[str, torch.Tensor]],
]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy_loss", POLICY_LOSS_NAMES)


@RATIOS.register("token")
def token_log_ratio(logp: torch.Tensor, denominator: torch.Tensor, mask: torch.Tensor):
    return torch.where(mask, logp - denominator, torch.zeros_like(logp))


def _sequence_mean(logp: torch.Tensor, denominator: torch.Tensor, mask: torch.Tensor):
    weight = mask.to(logp.dtype)
    per_token = token_log_ratio(logp, denominator, mask)
    return (per_token * weight).sum(-1) / weight.sum(-1).clamp(min=1.0)


@RATIOS.register("sequence")
def sequence_log_ratio(logp: torch.Tensor, denominator: torch.Tensor, mask: torch.Tensor):
    sequence = _sequence_mean(logp, denominator, mask)[:, None].expand_as(logp)
    return torch.where(mask, sequence, torch.zeros_like(logp))


@RATIOS.register("sequence_token")
def sequence_token_log_ratio(logp: torch.Tensor, denominator: torch.Tensor, mask: torch.Tensor):
    sequence = _sequence_mean(logp, denominator, mask).detach()[:, None]
    combined = (logp - logp.detach() + sequence).clamp(max=GSPO_TOKEN_LOG_RATIO_MAX)
    return torch.where(mask, combined, torch.zeros_like(logp))


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    objective: Objective,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    high = objective.clip_high(clip_eps)
    clipped_ratio = ratio.clamp(1 - clip_eps, 1 + high)
    unclipped = ratio if objective.delta is None else ratio.clamp(max=objective.delta)
    loss = -torch.minimum(unclipped * advantages, clipped_ratio * advantages)
    detached = ratio.detach()
    flags = {
        "clip_ratio/low_mean": clipped_low(detached, advantages, clip_eps),
        "clip_ratio/high_mean": clipped_high(detached, advantages, high),
    }
    if objective.clip_ratio_c is not None:
        dual = -advantages * objective.clip_ratio_c
        flags["clip_ratio/dual_mean"] = (loss.detach() > dual) & (advantages < 0)
        loss = torch.where(advantages < 0, torch.minimum(dual, loss), loss)
    return loss, flags


@POLICY_LOSSES.register("cispo")
def cispo(
    ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    objective: Objective,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    cap = objective.clip_high(clip_eps)
    weight = ratio.clamp(max=cap).detach()
    flags = {"cispo_clip_ratio": (ratio.detach() > cap) & (advantages > 0)}
    return -weight * advantages * logp, flags


@POLICY_LOSSES.register("sapo")
def sapo(
    ratio: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    objective: Objective,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    positive = torch.full_like(advantages, objective.sapo_temperature_pos)
    negative = torch.full_like(advantages, objective.sapo_temperature_neg)
    temperatures = torch.where(advantages > 0, positive, negative)
    gate = torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures
    return -gate * advantages, {}
