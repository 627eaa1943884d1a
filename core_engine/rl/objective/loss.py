"""The policy loss, combining the objective's registered parts (`aggregation`, `surrogates`,
in the spirit of verl's `core_algos.py`) with the importance correction. Advantages are
`advantages`; micro-batching, scoring and backward live in `update.py`.

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
ratio pi_theta / mu, no weight. `correction` decides all of this in one place; the loss only
combines what it hands over, in this order, whatever the objective:

1. the log-ratio per token against each token's denominator (pi_prox if corrected, else mu);
   at `importance_sampling_level` "sequence" / "sequence_token" (GSPO) the sequence's ratio is
   the mean of those per-token log-ratios, so a sample whose tail an older version sampled
   mixes both denominators;
2. the policy loss (`ppo_clip`, `cispo`, `sapo`) of that ratio, per token;
3. times each corrected token's behaviour weight (per token, at every level: as TRL multiplies
   its vLLM importance ratio into the per-token loss after the surrogate);
4. with `top_entropy_quantile` < 1, times the 80/20 mask (TRL's `get_high_entropy_mask`, its
   threshold the quantile of the whole step's trained tokens' entropies);
5. aggregated by `loss_type` over the step (`aggregation.StepTotals`), plus `kl_coef` times the
   k3 KL to the reference under the same aggregation, minus `entropy_coef` times the mean
   entropy of the tokens the policy term acts on (TRL's bonus, over the whole step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from core_engine.rl.config import IMPORTANCE_MODES
from core_engine.rl.objective.aggregation import AGGREGATIONS, StepTotals
from core_engine.rl.objective.clip import clip_active
from core_engine.rl.objective.settings import Objective
from core_engine.rl.objective.surrogates import POLICY_LOSSES, RATIOS


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
class TokenRecord:
    """What the loss did to each token, [N, T] without gradient: the ratio it used, the
    behaviour weight it applied (1 where uncorrected, 0 where the token dropped out), whether
    the token was corrected, clipped (any of the policy loss's flags, on a trained token) and
    trained (the mask, times the 80/20 mask with `top_entropy_quantile` < 1)."""

    ratio: torch.Tensor
    weight: torch.Tensor
    corrected: torch.Tensor
    clipped: torch.Tensor
    trained: torch.Tensor

    def samples(self, lengths: Sequence[int]) -> list[SampleLossRecord]:
        """One record per row, trimmed to its response's `lengths`."""
        columns = (self.ratio, self.weight, self.trained, self.corrected, self.clipped)
        rows = zip(*(column.tolist() for column in columns), strict=True)
        return [
            SampleLossRecord(*(values[:length] for values in row))
            for row, length in zip(rows, lengths, strict=True)
        ]


@dataclass(frozen=True)
class SampleLossRecord:
    """One sample's `TokenRecord`, one entry per response token."""

    ratios: list[float]
    weights: list[float]
    trained: list[bool]
    corrected: list[bool]
    clipped: list[bool]


@dataclass(frozen=True)
class LossOutput:
    """The loss and its statistics. With `StepTotals` shared by the micro-batches of a step,
    `loss`, `kl` and the fractions add up over micro-batches to the whole step's values (the
    fractions and `kl` are token means over the step's trained tokens); `importance` holds
    sums over corrected tokens (`importance_sums`' keys); `fractions` the policy loss's
    named token shares (TRL's `clip_ratio/low_mean`, ...; shares of tokens at every ratio
    level, where TRL's are of sequences at "sequence"); `tokens` what it did per token."""

    loss: torch.Tensor
    kl: float
    clip_fraction: float  # tokens where the clip is active (TRL's clip_ratio/region_mean)
    ratio_outside_fraction: float  # tokens whose ratio left [1 - low, 1 + high], clipped or not
    ratio_max: float
    tokens: TokenRecord
    importance: dict[str, float] = field(default_factory=dict)
    fractions: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Correction:
    """Which tokens are corrected, each token's ratio denominator, and the corrected tokens'
    behaviour weights (None: no token is corrected) with their sums."""

    corrected: torch.Tensor
    denominator: torch.Tensor
    weights: torch.Tensor | None
    sums: dict[str, float]


def correction(
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    lags: torch.Tensor | None,
    importance: Importance,
) -> Correction:
    """The importance correction's inputs to the loss (module docstring), all [N, T]."""
    corrected = mask & (lags > 0) if lags is not None else torch.zeros_like(mask)
    if importance.correct_on_policy:
        corrected = mask
    if not bool(corrected.any()):
        return Correction(corrected, behaviour, None, {})
    weights, raw = importance_weights(proximal, behaviour, corrected, importance)
    sums = importance_sums(weights, raw, corrected, lags, importance.cap)
    denominator = torch.where(corrected, proximal, behaviour)
    return Correction(corrected, denominator, weights, sums)


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


def high_entropy_mask(
    entropy: torch.Tensor, mask: torch.Tensor, threshold: float | torch.Tensor
) -> torch.Tensor:
    """TRL's `get_high_entropy_mask` given its threshold: tokens whose entropy is at least
    `threshold`, on the mask."""
    return ((entropy * mask.float()) >= threshold) & mask.bool()


def entropy_threshold(entropies: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """The entropy at the (1 - `top_quantile`) quantile of a step's trained tokens (TRL
    quantiles its gathered tokens at 1 - top_entropy_quantile)."""
    return torch.quantile(entropies.float(), 1 - top_quantile)


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
    totals: StepTotals | None = None,
    objective: Objective | None = None,
    entropy: torch.Tensor | None = None,
    threshold: float | torch.Tensor | None = None,
) -> LossOutput:
    """The objective's loss with its importance correction (module docstring).

    All tensors are [N, T] over response positions (`mask` selects real tokens; `lags` the
    trainer's version minus the sampling version, None: all 0), except `advantages` [N]. The
    optional KL to a frozen reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1.
    `totals`: the whole step's (default: this call's tokens and sequences, one micro-batch);
    `objective`: default, today's GRPO.
    `entropy`: the tokens' entropies (with gradient for `entropy_coef`); `threshold`: the
    step's 80/20 entropy threshold when `objective.top_entropy`. Masked positions are zeroed
    before any exponent: whatever they hold cannot turn the loss into NaN.
    """
    objective = objective or Objective()
    mask = mask.bool()
    weight = mask.float()
    acting = weight  # the tokens the policy term (and the entropy bonus) acts on
    if objective.top_entropy:
        if entropy is None or threshold is None:
            raise ValueError("top_entropy_quantile < 1 needs the tokens' entropy and threshold")
        acting = high_entropy_mask(entropy.detach(), mask, threshold).float()
    if totals is None:
        count = max(float(weight.sum()), 1.0)
        bonus = max(float(acting.sum()), 1.0)
        totals = StepTotals(count, max(len(mask), 1), 1, objective.completion_length, bonus)
    tokens = totals.tokens
    fix = correction(proximal, behaviour, mask, lags, importance)
    log_ratio = RATIOS[objective.importance_sampling_level](logp, fix.denominator, mask)
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]
    per_token, flags = POLICY_LOSSES[objective.policy_loss](ratio, logp, adv, clip_eps, objective)
    applied = torch.ones_like(weight)
    if fix.weights is not None:
        applied = torch.where(fix.corrected, fix.weights, applied)
        per_token = per_token * applied
    if objective.top_entropy:
        per_token = per_token * acting
    aggregate = AGGREGATIONS[objective.loss_type]
    loss = aggregate(per_token, weight, totals)
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None and kl_coef:
        delta = torch.where(mask, ref_logp - logp, torch.zeros_like(logp))
        k3 = torch.exp(delta) - delta - 1
        kl = (k3 * weight).sum() / tokens
        loss = loss + kl_coef * aggregate(k3, weight, totals)
    if objective.entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef needs the tokens' entropy")
        loss = loss - objective.entropy_coef * (entropy * acting).sum() / totals.bonus_tokens
    ratio = ratio.detach()
    high = objective.clip_high(clip_eps)
    outside = ((ratio - 1) > high) | ((1 - ratio) > clip_eps)
    trained = acting.bool()
    flagged = torch.zeros_like(mask)
    for flag in flags.values():
        flagged = flagged | flag
    record = TokenRecord(ratio, applied, fix.corrected, flagged & trained, trained)
    return LossOutput(
        loss=loss,
        kl=float(kl.detach()),
        clip_fraction=float((clip_active(ratio, adv, clip_eps, high) & mask).sum()) / tokens,
        ratio_outside_fraction=float((outside & mask).sum()) / tokens,
        ratio_max=float(ratio[mask].max()) if mask.any() else 1.0,
        tokens=record,
        importance=fix.sums,
        fractions={name: float((flag & mask).sum()) / tokens for name, flag in flags.items()},
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
