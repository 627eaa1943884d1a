"""The objective's registered parts against the formulas as their reference sources write them,
computed here independently in float64: TRL 1.16's `GRPOTrainer._compute_loss` (loss types,
sequence-level ratios, CISPO, SAPO, delta, the 80/20 mask, the entropy bonus, the clip
metrics) and its advantages (`_generate_and_score_completions`: `scale_rewards`), verl's
`core_algos.py` (dual clip, GSPO-token, `seq-mean-token-sum`, RLOO, REINFORCE++-baseline with
`masked_whiten`), transformers' schedules. Then the same through `accumulate_gradients`:
one micro-batch or several give the whole step's gradient."""

import dataclasses
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.rl.config import GRPOConfig
from core_engine.rl.objective.advantages import ADVANTAGES, AdvantageSettings, advantages
from core_engine.rl.objective.aggregation import AGGREGATIONS, StepTotals
from core_engine.rl.objective.choices import (
    ADVANTAGE_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    POLICY_LOSSES,
)
from core_engine.rl.objective.logprobs import packed_response_scores, selective_logprobs
from core_engine.rl.objective.loss import Importance, entropy_threshold, policy_loss
from core_engine.rl.objective.registry import Registry
from core_engine.rl.objective.settings import Objective
from core_engine.rl.objective.surrogates import POLICY_LOSSES as POLICY_LOSS_REGISTRY
from core_engine.rl.objective.surrogates import RATIOS
from core_engine.rl.objective.update import accumulate_gradients, pack_micro_batches
from core_engine.rl.rollout import RolloutResult
from core_engine.rl.trainer.schedule import lr_schedule
from core_engine.rl.trainer.screen import train_samples, trained_tokens

from .reference import make_pair
from .test_rl_scale import samples, settings

F64 = torch.float64


# ----------------------------------------------------------------- the references, transcribed
def trl_compute_loss(
    per_token_logps,
    old_per_token_logps,
    advantages,
    mask,
    loss_type="dapo",
    importance_sampling_level="token",
    epsilon_low=0.2,
    epsilon_high=0.2,
    delta=None,
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    max_completion_length=8,
    beta=0.0,
    ref_per_token_logps=None,
    entropies=None,
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
):
    """TRL 1.16 `GRPOTrainer._compute_loss` on one process, one accumulation step
    (num_items_in_batch = the mask's sum), no vLLM; its loss and its clip metrics."""
    if top_entropy_quantile < 1.0:
        local = entropies[mask.bool()].float()
        entropy_threshold = torch.quantile(local, 1 - top_entropy_quantile)
        masked_entropies = entropies * mask.float()
        entropy_mask = (masked_entropies >= entropy_threshold) & mask.bool()
    else:
        entropy_mask = None
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps)
            - 1
        )
    metrics = {}
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
        metrics["cispo_clip_ratio"] = (coef_1 > epsilon_high) & (advantages > 0)
    elif loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss1 = coef_1 * advantages
        per_token_loss2 = coef_2 * advantages
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        # the metrics, which TRL computes after the loss (`coef_1` clamped by delta)
        metrics["clip_ratio/low_mean"] = (coef_1 < 1 - epsilon_low) & (advantages < 0)
        metrics["clip_ratio/high_mean"] = (coef_1 > 1 + epsilon_high) & (advantages > 0)
    elif loss_type == "sapo":
        # TRL passes Python floats, which torch.where makes float32: in float64 here
        pos, neg = (
            torch.tensor(t, dtype=F64) for t in (sapo_temperature_pos, sapo_temperature_neg)
        )
        temperatures = torch.where(advantages > 0, pos, neg)
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * advantages
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type in ["grpo", "sapo"]:
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    elif loss_type in ["cispo", "dapo"]:
        normalizer = mask.sum().clamp(min=1.0)
        loss = (per_token_loss * mask).sum() / normalizer
    if entropy_coef:
        effective_mask = mask if entropy_mask is None else mask * entropy_mask
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0)
        loss = loss - entropy_coef * entropy_loss

    def global_masked_mean(x):
        if x.shape[1] == 1:  # importance_sampling_level "sequence": one value per sequence
            return float(x.sum() / x.shape[0])
        return float((x * mask).sum() / mask.sum().clamp(min=1.0))

    return loss, {k: global_masked_mean(v.to(mask.dtype)) for k, v in metrics.items()}


def verl_masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    """verl `core_algos.agg_loss`."""
    if loss_agg_mode == "token-mean":
        return verl_masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1))
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1)
        return torch.mean(seq_losses)
    raise ValueError(loss_agg_mode)


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, lo, hi, clip_ratio_c, mode):
    """verl `compute_policy_loss_vanilla` (dual clip): loss and pg_clipfrac_lower."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return verl_agg_loss(pg_losses, response_mask, mode), float(pg_clipfrac_lower)


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, lo, hi):
    """verl `compute_policy_loss_gspo` (GSPO-token), seq-mean-token-mean."""
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = (
        log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    )
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - lo, 1 + hi)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    return verl_agg_loss(pg_losses, response_mask, "seq-mean-token-mean")


def tokens(seed=3, n=4, t=6, spread=0.5):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=F64) * 3
    logp = old + spread * torch.randn(n, t, generator=gen, dtype=F64)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=F64)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 4:] = mask[3, 2:] = False
    return logp.requires_grad_(True), old, advantages, mask


def grad(loss, x):
    return torch.autograd.grad(loss, x, retain_graph=True)[0]


# ----------------------------------------------------------------- policy losses and aggregation
TRL_CASES = [
    # (our policy_loss, loss_type, level, clip_eps_high, delta, kl)
    ("ppo_clip", "dapo", "token", 0.28, None, 0.0),
    ("ppo_clip", "grpo", "token", None, None, 0.04),
    ("ppo_clip", "bnpo", "token", None, 1.5, 0.0),
    ("ppo_clip", "dr_grpo", "token", 0.28, None, 0.04),
    ("ppo_clip", "grpo", "sequence", None, None, 0.0),
    ("ppo_clip", "dapo", "sequence", 0.3, None, 0.0),
    ("cispo", "dapo", "token", 1.3, None, 0.0),
    ("cispo", "dapo", "sequence", 1.3, None, 0.0),
    ("sapo", "grpo", "token", None, None, 0.04),
]


@pytest.mark.parametrize(("loss", "loss_type", "level", "high", "delta", "beta"), TRL_CASES)
def test_policy_losses_and_aggregations_equal_trls_compute_loss(
    loss, loss_type, level, high, delta, beta
):
    logp, old, adv, mask = tokens()
    ref = old - 0.3
    objective = Objective(
        loss_type=loss_type,
        policy_loss=loss,
        importance_sampling_level=level,
        clip_eps_high=high,
        delta=delta,
        completion_length=8,
    )
    out = policy_loss(
        logp, old, old, adv, mask, None, Importance(), 0.2, beta, ref, None, objective
    )
    trl_type = {"ppo_clip": loss_type}.get(loss, loss)  # TRL's cispo/sapo name the loss
    if trl_type == "sapo":
        assert loss_type == "grpo"  # TRL aggregates sapo as grpo
    theirs, shares = trl_compute_loss(
        logp,
        old,
        adv,
        mask.to(F64),
        trl_type,
        level,
        0.2,
        high or 0.2,
        delta,
        max_completion_length=8,
        beta=beta,
        ref_per_token_logps=ref,
    )
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)
    if level == "token":  # at sequence level TRL's shares are of sequences, ours of tokens
        assert out.fractions == pytest.approx(shares, abs=1e-12)
    if loss == "ppo_clip" and level == "token":  # the clip is exercised on both sides
        assert shares["clip_ratio/low_mean"] > 0 and shares["clip_ratio/high_mean"] > 0
    if loss == "cispo" and level == "token":
        assert shares["cispo_clip_ratio"] > 0


def test_dual_clip_equals_verls_vanilla_policy_loss():
    logp, old, adv, mask = tokens(seed=8, spread=1.0)
    with torch.no_grad():
        logp[1, 0] = old[1, 0] + 1.5  # ratio 4.5 > c on a negative advantage
    objective = Objective(clip_eps_high=0.28, clip_ratio_c=3.0)
    out = policy_loss(logp, old, old, adv, mask, objective=objective)
    theirs, lower = verl_vanilla(
        old, logp, adv[:, None], mask.to(F64), 0.2, 0.28, 3.0, "token-mean"
    )
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)
    assert out.fractions["clip_ratio/dual_mean"] == pytest.approx(lower, abs=1e-12)
    assert lower > 0  # some negative-advantage token's ratio is past c


def test_gspo_token_equals_verls_gspo():
    logp, old, adv, mask = tokens(seed=9)
    objective = Objective(loss_type="grpo", importance_sampling_level="sequence_token")
    out = policy_loss(logp, old, old, adv, mask, objective=objective)
    theirs = verl_gspo(old, logp, adv[:, None], mask.to(F64), 0.2, 0.2)
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)


def test_seq_mean_token_sum_equals_verls_agg_loss():
    logp, old, adv, mask = tokens(seed=10)
    objective = Objective(loss_type="seq_mean_token_sum")
    out = policy_loss(logp, old, old, adv, mask, objective=objective)
    ratio = torch.exp(logp - old)
    per_token = torch.maximum(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.2))
    theirs = verl_agg_loss(per_token, mask.to(F64), "seq-mean-token-sum")
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)


def test_top_entropy_mask_and_entropy_bonus_equal_trls():
    logp, old, adv, mask = tokens(seed=11)
    gen = torch.Generator().manual_seed(2)
    entropy = (torch.rand(logp.shape, generator=gen, dtype=F64) * 4).requires_grad_(True)
    objective = Objective(loss_type="grpo", top_entropy_quantile=0.3, entropy_coef=0.01)
    threshold = entropy_threshold(entropy.detach()[mask], 0.3)
    out = policy_loss(
        logp, old, old, adv, mask, objective=objective, entropy=entropy, threshold=threshold
    )
    theirs, _ = trl_compute_loss(
        logp,
        old,
        adv,
        mask.to(F64),
        "grpo",
        entropies=entropy,
        top_entropy_quantile=0.3,
        entropy_coef=0.01,
    )
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)
    assert torch.allclose(grad(out.loss, entropy), grad(theirs, entropy), atol=1e-12)
    assert 0 < int(grad(theirs, logp).ne(0).sum()) < int(mask.sum())  # the mask bites


def test_a_sequence_ratio_over_lagged_tokens_mixes_denominators_and_weighs_per_token():
    """The composition the loss's docstring states (no reference source has it): lagged tokens
    take pi_prox into the sequence's mean log-ratio, and their truncated weight pi_prox / mu
    multiplies their per-token surrogate."""
    logp, prox, adv, mask = tokens(seed=12)
    gen = torch.Generator().manual_seed(4)
    behaviour = prox + 0.5 * torch.randn(prox.shape, generator=gen, dtype=F64)
    lags = torch.zeros_like(mask, dtype=torch.long)
    lags[:, 3:] = 1
    objective = Objective(loss_type="grpo", importance_sampling_level="sequence")
    out = policy_loss(
        logp, prox, behaviour, adv, mask, lags, Importance("truncate", 1.5), objective=objective
    )
    lagged = mask & (lags > 0)
    m = mask.to(F64)
    denominator = torch.where(lagged, prox, behaviour)
    seq = ((logp - denominator) * m).sum(-1) / m.sum(-1)
    ratio = torch.exp(seq)[:, None]
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    weight = torch.where(lagged, torch.exp(prox - behaviour).clamp(max=1.5), 1.0)
    theirs = ((-surrogate * weight * m).sum(-1) / m.sum(-1)).mean()
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad(out.loss, logp), grad(theirs, logp), atol=1e-12)


def test_aggregations_split_over_micro_batches_add_up_to_the_step():
    """Each aggregation of rows split in two parts, both divided by the step's totals, sums to
    the whole step's TRL / verl value; bnpo is by definition the mean of the parts' own
    token means (TRL: the local batch's mean / gradient accumulation steps)."""
    gen = torch.Generator().manual_seed(5)
    loss = torch.randn(5, 7, generator=gen, dtype=F64)
    mask = torch.rand(5, 7, generator=gen) > 0.3
    m = mask.to(F64)
    totals = StepTotals(float(m.sum()), 5, 2, completion_length=9)
    parts = [slice(0, 2), slice(2, 5)]

    def split(name):
        return sum(float(AGGREGATIONS[name](loss[p], m[p], totals)) for p in parts)

    per_sequence = (loss * m).sum(-1)
    assert split("dapo") == pytest.approx(float(per_sequence.sum() / m.sum()), abs=1e-12)
    assert split("grpo") == pytest.approx(
        float((per_sequence / m.sum(-1).clamp(min=1.0)).mean()), abs=1e-12
    )
    assert split("dr_grpo") == pytest.approx(float(per_sequence.sum() / (5 * 9)), abs=1e-12)
    assert split("seq_mean_token_sum") == pytest.approx(
        float(verl_agg_loss(loss, m, "seq-mean-token-sum")), abs=1e-12
    )
    bnpo = sum(float(((loss[p] * m[p]).sum() / m[p].sum()) / 2) for p in parts)
    assert split("bnpo") == pytest.approx(bnpo, abs=1e-12)


# ----------------------------------------------------------------- advantages
def trl_advantages(rewards, num_generations, scale_rewards):
    """TRL 1.16 `_generate_and_score_completions`, sum_then_normalize, its `nanstd` (Bessel),
    with our epsilon (verl's 1e-6) for TRL's 1e-4."""

    def nanstd(tensor, dim=None):
        mean = torch.nanmean(tensor, dim=dim, keepdim=True)
        variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
        count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
        variance *= count / (count - 1)
        return torch.sqrt(variance).squeeze() if dim is None else torch.sqrt(variance)

    mean_grouped = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped = mean_grouped.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1).squeeze(1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-6)
    return advantages


REWARDS = torch.tensor(
    [[1.0, 0.0, 0.5, 1.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.3, 0.9, 0.1]], dtype=F64
)
LENGTHS = torch.tensor([[3, 5, 2, 4], [1, 6, 2, 2], [4, 4, 0, 3]])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_advantages_equal_trls_scale_rewards(scale):
    ours = advantages(REWARDS, LENGTHS, AdvantageSettings("grpo", scale, "unbiased"))
    theirs = trl_advantages(REWARDS.view(-1), 4, scale).view(3, 4)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert ours[0].abs().sum() > 0 and torch.equal(ours[1], torch.zeros(4, dtype=F64))


def test_the_default_grpo_advantage_is_todays_population_std_formula_bit_for_bit():
    rewards = REWARDS.float()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    today = torch.where(std < 1e-6, torch.zeros_like(rewards), (rewards - mean) / (std + 1e-6))
    assert torch.equal(advantages(rewards, LENGTHS), today)
    unbiased = advantages(rewards, LENGTHS, AdvantageSettings(std="unbiased"))
    assert not torch.allclose(unbiased, today)


def verl_by_index(rewards, body):
    scores = rewards.reshape(-1).clone()
    index = [i // rewards.shape[1] for i in range(scores.shape[0])]
    return body(scores, index).view(rewards.shape)


def test_rloo_and_dr_grpo_equal_verls_estimators():
    def rloo(scores, index):  # compute_rloo_outcome_advantage
        id2score, id2mean = {}, {}
        for i in range(scores.shape[0]):
            id2score.setdefault(index[i], []).append(scores[i])
        for idx in id2score:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
        for i in range(scores.shape[0]):
            response_num = len(id2score[index[i]])
            scores[i] = scores[i] * response_num / (response_num - 1) - id2mean[
                index[i]
            ] * response_num / (response_num - 1)
        return scores

    def grpo_no_std(scores, index):  # compute_grpo_outcome_advantage, norm_adv_by_std False
        id2score = {}
        for i in range(scores.shape[0]):
            id2score.setdefault(index[i], []).append(scores[i])
        means = {idx: torch.mean(torch.stack(v)) for idx, v in id2score.items()}
        for i in range(scores.shape[0]):
            scores[i] = scores[i] - means[index[i]]
        return scores

    ours = advantages(REWARDS, LENGTHS, AdvantageSettings("rloo"))
    assert torch.allclose(ours, verl_by_index(REWARDS, rloo), atol=1e-12)
    ours = advantages(REWARDS, LENGTHS, AdvantageSettings("dr_grpo"))
    assert torch.allclose(ours, verl_by_index(REWARDS, grpo_no_std), atol=1e-12)


def test_reinforce_pp_equals_verls_baseline_estimator_with_masked_whiten():
    """verl `compute_reinforce_plus_plus_baseline_outcome_advantage`: group mean subtracted,
    tiled over each response's tokens, `masked_whiten` (Bessel) over the batch's tokens."""
    width = int(LENGTHS.max())
    response_mask = (torch.arange(width)[None, :] < LENGTHS.view(-1, 1)).to(F64)
    scores = REWARDS.reshape(-1) - REWARDS.mean(dim=1).repeat_interleave(4)
    scores = scores.unsqueeze(-1).tile([1, width]) * response_mask
    mean = verl_masked_mean(scores, response_mask)
    variance = verl_masked_mean((scores - mean) ** 2, response_mask)
    variance = variance * response_mask.sum() / (response_mask.sum() - 1)
    whitened = (scores - mean) * torch.rsqrt(variance + 1e-8) * response_mask
    ours = advantages(REWARDS, LENGTHS, AdvantageSettings("reinforce_pp")).view(-1)
    rows = LENGTHS.view(-1) > 0
    assert torch.allclose(ours[rows], whitened[rows, 0], atol=1e-12)


# ----------------------------------------------------------------- through accumulate_gradients
@pytest.fixture(scope="module")
def model():
    return make_pair("qwen2", seed=5, vocab_size=4096, tie_word_embeddings=False)[0]


def step_gradients(model, batch, budget, objective, kl=0.0):
    model.zero_grad(set_to_none=True)
    result = accumulate_gradients(
        model, batch, settings(kl_coef=kl, max_tokens=budget, objective=objective)
    )
    return result, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_give_the_whole_steps_gradient_for_every_aggregation(model, loss_type):
    """Several micro-batches against the step's loss written as TRL / verl write it over one
    packed forward of the whole step (bnpo: the mean of its micro-batches' token means)."""
    batch = samples()
    objective = Objective(
        loss_type=loss_type,
        importance_sampling_level="sequence",
        clip_eps_high=0.28,
        completion_length=12,
    )
    budget = 20
    parts = pack_micro_batches([s.num_tokens for s in batch], budget)
    assert len(parts) >= 3
    result, ours = step_gradients(model, batch, budget, objective)
    model.zero_grad(set_to_none=True)
    logp, _ = packed_response_scores(
        model, [s.prompt for s in batch], [s.response for s in batch], 0.8, 4096
    )
    logp = pad_sequence(logp, batch_first=True)
    old = pad_sequence([torch.tensor(s.behaviour) for s in batch], batch_first=True)
    mask = pad_sequence([torch.ones(len(s.response)) for s in batch], batch_first=True)
    adv = torch.tensor([s.advantage for s in batch])
    if loss_type == "bnpo":
        reference = sum(
            trl_compute_loss(logp[p], old[p], adv[p], mask[p], "bnpo", "sequence", 0.2, 0.28)[0]
            for p in parts
        ) / len(parts)
    elif loss_type == "seq_mean_token_sum":
        seq = ((logp - old) * mask).sum(-1) / mask.sum(-1)
        ratio = torch.exp(seq)[:, None]
        per_token = torch.maximum(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.28))
        reference = verl_agg_loss(per_token, mask, "seq-mean-token-sum")
    else:
        reference = trl_compute_loss(
            logp, old, adv, mask, loss_type, "sequence", 0.2, 0.28, max_completion_length=12
        )[0]
    reference.backward()
    assert result.loss == pytest.approx(float(reference), rel=1e-5, abs=1e-7)
    for name, parameter in model.named_parameters():
        assert torch.allclose(ours[name], parameter.grad, rtol=1e-4, atol=1e-7), name


def test_entropy_terms_are_exact_over_micro_batches(model):
    """The 80/20 threshold and the entropy bonus are over the whole step: one micro-batch or
    several give the same gradient."""
    batch = samples()
    objective = Objective(loss_type="grpo", top_entropy_quantile=0.4, entropy_coef=0.05)
    whole, one = step_gradients(model, batch, 4096, objective)
    split, several = step_gradients(model, batch, 20, objective)
    assert split.micro_batches > 2 and whole.micro_batches == 1
    assert split.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-7)
    for name in one:
        assert torch.allclose(one[name], several[name], rtol=1e-4, atol=1e-7), name
    _, without = step_gradients(model, batch, 4096, dataclasses.replace(objective, entropy_coef=0))
    assert not torch.allclose(one["lm_head.weight"], without["lm_head.weight"])


def test_the_entropy_gradient_equals_autograd_of_the_entropy_formula():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=gen).requires_grad_(True)
    weight = torch.randn(11, 5, generator=gen).requires_grad_(True)
    targets = torch.randint(0, 11, (7,), generator=gen)
    coefficients = torch.randn(7, generator=gen)
    logp, entropy = selective_logprobs(hidden, weight, targets, 0.7, chunk_rows=3)
    ours = torch.autograd.grad((entropy * coefficients).sum() + logp.sum(), (hidden, weight))
    h, w = hidden.detach().double().requires_grad_(True), weight.detach().double().requires_grad_()
    log_probs = torch.log_softmax(h @ w.T / 0.7, dim=-1)
    reference = -(log_probs.exp() * log_probs).sum(-1)
    total = (reference * coefficients.double()).sum() + log_probs.gather(1, targets[:, None]).sum()
    theirs = torch.autograd.grad(total, (h, w))
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a.double(), b, atol=1e-5)


# ----------------------------------------------------------------- truncated completions
def rollout(finish_reasons, responses):
    n = len(responses)
    return RolloutResult(
        prompts=["p"],
        messages=[[]],
        references=[""],
        prompt_ids=[[1, 2]],
        response_ids=responses,
        completions=[""] * n,
        behaviour_logprobs=[[-1.0] * len(r) for r in responses],
        temp_logprobs=[[-1.0] * len(r) for r in responses],
        finish_reasons=finish_reasons,
        errors=[None] * n,
        cached_prompt_tokens=[0] * n,
        seeds=list(range(n)),
        policy_version=0,
        group_size=n,
        temperature=1.0,
        rewards=[1.0, 0.0, 0.5],
    )


def test_masked_truncated_completions_keep_no_token_but_count_as_sequences():
    result = rollout(["stop", "length", "stop"], [[5, 6], [7, 8, 9], [4]])
    assert trained_tokens(result, [0, 1, 2], True) == [2, 0, 1]
    assert trained_tokens(result, [0, 1, 2], False) == [2, 3, 1]
    assert trained_tokens(result, [0, 1], True) == [2, 0, 0]
    batch = train_samples(result, [0, 1, 2], [1.0, -1.0, 0.5], {}, 0, mask_truncated=True)
    assert [s.trained_tokens for s in batch] == [2, 0, 1] and len(batch) == 3


# ----------------------------------------------------------------- config, registry, schedule
BASE = {"model": "m", "output_dir": "o", "task": "addition"}


def test_trls_names_are_accepted_for_ours():
    config = GRPOConfig.from_dict(
        {
            **BASE,
            "num_generations": 4,
            "beta": 0.04,
            "epsilon": 0.1,
            "epsilon_high": 0.28,
            "learning_rate": 1e-5,
            "max_completion_length": 12,
            "max_steps": 7,
            "scale_rewards": False,
        }
    )
    assert (config.group_size, config.kl_coef, config.clip_eps, config.clip_eps_high) == (
        4,
        0.04,
        0.1,
        0.28,
    )
    assert (config.lr, config.max_tokens, config.steps, config.scale_rewards) == (
        1e-5,
        12,
        7,
        "none",
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_iterations": 2}, "'num_iterations' \\(TRL\\) has no equal here: updates_per_batch"),
        ({"beta": 0.1, "kl_coef": 0.1}, "'beta' is TRL's name for 'kl_coef': give one of them"),
        ({"policy_loss": "cispo"}, "cispo' caps the importance weight at clip_eps_high"),
        ({"delta": 1.1}, "delta \\(1.1\\) must exceed 1 \\+ the upper clip \\(1.2\\)"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c \\(dual clip\\) must be > 1"),
        ({"policy_loss": "sapo", "delta": 2.0}, "policy_loss 'sapo' has none"),
        ({"advantage": "rloo", "scale_rewards": "batch"}, "belong to advantage 'grpo'"),
        ({"advantage": "rloo", "group_size": 1}, "'rloo' needs group_size >= 2"),
        ({"loss_type": "luspo"}, "loss_type must be one of dapo, grpo, bnpo"),
        ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type must be one of"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile must be <= 1"),
    ],
)
def test_invalid_objectives_are_refused_with_the_reason(values, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig.from_dict({**BASE, **values})


def test_every_configurable_name_is_registered_and_only_those():
    assert sorted(AGGREGATIONS.names) == sorted(LOSS_TYPES)
    assert sorted(POLICY_LOSS_REGISTRY.names) == sorted(POLICY_LOSSES)
    assert sorted(RATIOS.names) == sorted(IMPORTANCE_SAMPLING_LEVELS)
    assert sorted(ADVANTAGES.names) == sorted(ADVANTAGE_ESTIMATORS)
    registry = Registry("policy_loss", ("a",))
    with pytest.raises(ValueError, match="'b' is not among the config's"):
        registry.register("b")
    with pytest.raises(ValueError, match="unknown policy_loss 'a'"):
        registry["a"]


def transformers_rate(kind, step, warmup, total):
    """transformers' `_get_*_schedule_with_warmup_lr_lambda`, as written there."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if kind == "constant":
        return 1.0
    if kind == "linear":
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedules_follow_transformers_and_resume_at_their_step(kind):
    config = GRPOConfig(**BASE, steps=10, lr=0.1, lr_scheduler_type=kind, warmup_ratio=0.25)
    warmup = 3  # ceil(0.25 * 10)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=config.lr)
    lr_schedule(config, optimizer, 0)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # steps the schedule too
    expected = [0.1 * transformers_rate(kind, s, warmup, 10) for s in range(10)]
    assert rates == pytest.approx(expected, abs=1e-15)
    resumed = torch.optim.SGD([parameter], lr=rates[6])  # a checkpoint's optimizer: a later lr
    lr_schedule(config, resumed, 6)
    assert resumed.param_groups[0]["lr"] == pytest.approx(expected[6], abs=1e-15)


def test_a_constant_rate_without_warm_up_has_no_schedule():
    config = GRPOConfig(**BASE)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    assert lr_schedule(config, optimizer, 4) is None
    assert optimizer.param_groups[0]["lr"] == config.lr
