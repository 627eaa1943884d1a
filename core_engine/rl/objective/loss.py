"""The GRPO objective, as pure functions over tensors (in the spirit of verl's `core_algos.py`):
group-normalised advantages and the clipped, token-averaged policy loss with its importance
correction. Micro-batching, scoring and backward live in `update.py`.

Three log-probs per response token: the current policy's `logp` (with gradient), the trainer's
own before this update, `proximal` (pi_prox), and the engine's at sampling time, `behaviour`
(mu). A token is *corrected* when its behaviour log-prob depends on an older version than
pi_prox's (`lags > 0`: it was sampled by one, or, in flight, sampled after an update over K/V
an older version wrote; `trainer.metrics.behaviour_lags`) or, with `correct_on_policy`, always
(a lower-precision engine: the train/infer mismatch). Then its PPO
ratio is pi_theta / pi_prox and its surrogate is weighted by w = pi_prox / mu under one of two
importance modes with one cap:

- `truncate` (truncated importance sampling, TIS; TRL's `vllm_importance_sampling_mode =
  "token_truncate"`): weight min(w, cap);
- `mask` (AReaL's decoupled PPO, `ppo_actor_loss_fn` with `behav_imp_weight_cap`): weight w,
  or 0 where w > cap (the token drops out of the loss).

An uncorrected token (lag 0, no on-policy correction) keeps the synchronous loss exactly:
ratio pi_theta / mu, no weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core_engine.rl.config import IMPORTANCE_MODES
from core_engine.rl.objective.clip import clip_active


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [B, G] -> advantages (r - mean) / (population std + eps), and a [B] mask of
    groups whose rewards all agree (zero variance: no learning signal, advantage exactly 0)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    zero_variance = std.squeeze(1) < eps
    advantages = torch.where(std < eps, torch.zeros_like(rewards), (rewards - mean) / (std + eps))
    return advantages, zero_variance


@dataclass(frozen=True)
class Importance:
    """Which tokens are corrected and how (module docstring)."""

    mode: str = "truncate"
    cap: float = 2.0
    correct_on_policy: bool = False

    def __post_init__(self) -> None:
        if self.mode not in IMPORTANCE_MODES:
            raise ValueError(
                f"importance mode must be one of {IMPORTANCE_MODES}, got {self.mode!r}"
            )
        if not self.cap > 0:
            raise ValueError(f"importance cap must be positive, got {self.cap}")


@dataclass(frozen=True)
class LossOutput:
    """The loss and its statistics. With a `normaliser` shared by the micro-batches of a step,
    `loss`, `kl` and the fractions add up over micro-batches to the whole step's values;
    `importance` holds sums over corrected tokens (`importance_sums`' keys)."""

    loss: torch.Tensor
    kl: float
    clip_fraction: float  # tokens where the clip is active (TRL's clip_ratio/region_mean)
    ratio_outside_fraction: float  # tokens with |ratio - 1| > clip_eps, clipped or not
    ratio_max: float
    importance: dict[str, float] = field(default_factory=dict)


def importance_weights(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, importance: Importance
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, raw w = pi_prox / mu), both [N, T] without gradient; 0 off the mask."""
    raw = torch.exp(torch.where(mask, proximal - behaviour, torch.zeros_like(proximal))).detach()
    if importance.mode == "truncate":
        weights = torch.clamp(raw, max=importance.cap)
    else:
        weights = torch.where(raw <= importance.cap, raw, torch.zeros_like(raw))
    return torch.where(mask, weights, torch.zeros_like(weights)), raw


def policy_loss(
    logp: torch.Tensor,
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    lags: torch.Tensor | None = None,
    importance: Importance = Importance(),
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    normaliser: float | None = None,
) -> LossOutput:
    """The token-level PPO-clip objective with its importance correction.

    All tensors are [N, T] over response positions (`mask` selects real tokens; `lags` the
    trainer's version minus the sampling version, None: all 0), except `advantages` [N]. The
    optional KL to a frozen reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1.
    Sums are divided by `normaliser` (default: the tokens of this call). Masked positions are
    zeroed before any exponent: whatever they hold cannot turn the loss into NaN.
    """
    mask = mask.bool()
    weight = mask.float()
    tokens = float(normaliser) if normaliser is not None else max(float(weight.sum()), 1.0)
    corrected = mask & (lags > 0) if lags is not None else torch.zeros_like(mask)
    if importance.correct_on_policy:
        corrected = mask
    any_corrected = bool(corrected.any())
    denominator = torch.where(corrected, proximal, behaviour) if any_corrected else behaviour
    log_ratio = torch.where(mask, logp - denominator, torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]
    clipped_ratio = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    sums: dict[str, float] = {}
    if any_corrected:
        weights, raw = importance_weights(proximal, behaviour, corrected, importance)
        surrogate = surrogate * torch.where(corrected, weights, torch.ones_like(weights))
        sums = importance_sums(weights, raw, corrected, lags, importance.cap)
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
        importance=sums,
    )


def importance_sums(
    weights: torch.Tensor,
    raw: torch.Tensor,
    corrected: torch.Tensor,
    lags: torch.Tensor | None,
    cap: float,
) -> dict[str, float]:
    """Sums over the corrected tokens, split into lagged ones (`off_*`: sampled by an older
    version) and on-policy ones (`on_*`: the train/infer mismatch): token count, weight sum,
    raw-weight sum and max, tokens over the cap."""
    lagged = corrected & (lags > 0) if lags is not None else torch.zeros_like(corrected)
    sums: dict[str, float] = {}
    for prefix, selected in (("off", lagged), ("on", corrected & ~lagged)):
        if not bool(selected.any()):
            continue
        sums[f"{prefix}_tokens"] = float(selected.sum())
        sums[f"{prefix}_weight_sum"] = float(weights[selected].sum())
        sums[f"{prefix}_raw_sum"] = float(raw[selected].sum())
        sums[f"{prefix}_raw_max"] = float(raw[selected].max())
        sums[f"{prefix}_over_cap"] = float((raw[selected] > cap).sum())
    return sums
