"""GRPO: group-normalised advantages and the clipped, token-averaged policy loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core_engine.rl.clip import clip_active


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [B, G] -> advantages (r - mean) / (population std + eps), and a [B] mask of
    groups whose rewards all agree (zero variance: no learning signal, advantage exactly 0)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    zero_variance = std.squeeze(1) < eps
    advantages = torch.where(std < eps, torch.zeros_like(rewards), (rewards - mean) / (std + eps))
    return advantages, zero_variance


@dataclass(frozen=True)
class LossOutput:
    """The loss and its statistics. With a `normaliser` shared by the micro-batches of a step,
    `loss`, `kl` and the two fractions add up over micro-batches to the whole step's values."""

    loss: torch.Tensor
    kl: float
    clip_fraction: float  # tokens where the clip is active (TRL's clip_ratio/region_mean)
    ratio_outside_fraction: float  # tokens with |ratio - 1| > clip_eps, clipped or not
    ratio_max: float


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    normaliser: float | None = None,
    tis_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Token-level PPO-clip objective with importance ratio pi_theta / pi_behaviour.

    All tensors are [N, T] over response positions (`mask` selects real tokens), except
    `advantages` [N]. The optional KL to a frozen reference uses the k3 estimator
    exp(ref - logp) - (ref - logp) - 1. Sums are divided by `normaliser` (default: the tokens
    of this call), so micro-batches of one step pass the step's token count. `tis_weights`
    (truncated importance weights, no gradient) scale each token's surrogate. Masked positions
    are zeroed before any exponent: whatever they hold cannot turn the loss into NaN.
    """
    mask = mask.bool()
    weight = mask.float()
    tokens = float(normaliser) if normaliser is not None else max(float(weight.sum()), 1.0)
    log_ratio = torch.where(mask, logp - behaviour_logp, torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]
    clipped_ratio = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    if tis_weights is not None:
        surrogate = surrogate * torch.where(mask, tis_weights, torch.zeros_like(tis_weights))
    loss = -(surrogate * weight).sum() / tokens
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None and kl_coef:
        delta = torch.where(mask, ref_logp - logp, torch.zeros_like(logp))
        kl = ((torch.exp(delta) - delta - 1) * weight).sum() / tokens
        loss = loss + kl_coef * kl
    ratio = ratio.detach()
    active = clip_active(ratio, adv, clip_eps)
    outside = (ratio - 1).abs() > clip_eps
    return LossOutput(
        loss=loss,
        kl=float(kl.detach()),
        clip_fraction=float((active & mask).sum()) / tokens,
        ratio_outside_fraction=float((outside & mask).sum()) / tokens,
        ratio_max=float(ratio[mask].max()) if mask.any() else 1.0,
    )
