"""The policy objective against the formulas of the peers it names, as their sources write them:
AReaL's `ppo_actor_loss_fn` (the `mask` mode: decoupled PPO, tokens whose pi_prox / pi_behaviour
exceeds the cap drop out) and TRL's GRPO loss with `vllm_importance_sampling_correction` in
`token_truncate` mode (the `truncate` mode: the weight is capped). Per-token lag decides which
tokens are corrected; without any, the loss is exactly the synchronous one."""

import dataclasses
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.objective.loss import Importance, policy_loss
from core_engine.rl.objective.update import accumulate_gradients

from .reference import make_pair
from .test_rl_scale import samples, settings

CAP = 1.5
EPS = 0.2


def areal_ppo_actor_loss_fn(
    logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask, behav_imp_weight_cap
):
    """AReaL `areal/utils/functional.py::ppo_actor_loss_fn` (c_clip None), its loss only,
    transcribed line for line (`old_logprobs` are the behaviour policy's)."""
    loss_mask_count = loss_mask.count_nonzero() or 1
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    behav_kl = proximal_logprobs - old_logprobs
    behav_imp_weight = behav_kl.exp()
    behav_mask = (behav_imp_weight <= behav_imp_weight_cap).logical_and(loss_mask)
    behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count


def trl_grpo_loss(
    per_token_logps,
    old_per_token_logps,
    sampling_per_token_logps,
    advantages,
    completion_mask,
    epsilon,
    vllm_importance_sampling_cap,
):
    """TRL `GRPOTrainer`: `importance_sampling_ratio` (token_truncate) from
    `_generate_and_score_completions`, the per-token loss from `_compute_loss`, aggregated as
    its "bnpo" loss type (sum over the batch's tokens / their count)."""
    importance_sampling_ratio = torch.exp(old_per_token_logps - sampling_per_token_logps)
    importance_sampling_ratio = torch.clamp(
        importance_sampling_ratio, max=vllm_importance_sampling_cap
    )
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon)
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    per_token_loss = per_token_loss * importance_sampling_ratio
    return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


def random_tokens(seed=3, n=4, t=6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    prox = logp + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    behaviour = prox + 0.5 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 4:] = mask[3, 2:] = False
    return logp.requires_grad_(True), prox, behaviour, advantages, mask


def ours(mode, logp, prox, behaviour, advantages, mask, lags):
    out = policy_loss(logp, prox, behaviour, advantages, mask, lags, Importance(mode, CAP), EPS)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad


def test_mask_mode_is_areals_decoupled_loss():
    logp, prox, behaviour, advantages, mask = random_tokens()
    lags = torch.ones_like(mask, dtype=torch.long)
    out, grad = ours("mask", logp, prox, behaviour, advantages, mask, lags)
    theirs = areal_ppo_actor_loss_fn(logp, prox, behaviour, advantages[:, None], EPS, mask, CAP)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad, their_grad, atol=1e-12)
    over = (torch.exp(prox - behaviour) > CAP) & mask
    assert 0 < int(over.sum()) < int(mask.sum())  # the cap masks some tokens, not all
    assert out.importance["off_over_cap"] == int(over.sum())


def test_truncate_mode_is_trls_truncated_importance_sampling():
    logp, prox, behaviour, advantages, mask = random_tokens(seed=4)
    lags = torch.ones_like(mask, dtype=torch.long)
    out, grad = ours("truncate", logp, prox, behaviour, advantages, mask, lags)
    theirs = trl_grpo_loss(logp, prox, behaviour, advantages, mask.double(), EPS, CAP)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert torch.allclose(grad, their_grad, atol=1e-12)
    # ... and the two modes differ exactly where the cap is exceeded
    masked, _ = ours("mask", logp, prox, behaviour, advantages, mask, lags)
    assert float(masked.loss) != pytest.approx(float(out.loss), abs=1e-6)


def test_on_policy_correction_covers_lag_zero_tokens_too():
    logp, prox, behaviour, advantages, mask = random_tokens(seed=5)
    out = policy_loss(
        logp, prox, behaviour, advantages, mask, None, Importance("truncate", CAP, True), EPS
    )
    theirs = trl_grpo_loss(logp, prox, behaviour, advantages, mask.double(), EPS, CAP)
    assert float(out.loss) == pytest.approx(float(theirs), abs=1e-12)
    assert "on_tokens" in out.importance and "off_tokens" not in out.importance


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_off_policy_is_decided_per_token(mode):
    """A sample whose first tokens the trainer's version sampled and whose last an older one
    did (an in-flight update): its lag-0 tokens keep the synchronous loss (ratio to the
    behaviour, no weight), its lagged tokens get the peer's formula."""
    logp, prox, behaviour, advantages, mask = random_tokens(seed=6)
    lags = torch.zeros_like(mask, dtype=torch.long)
    lags[:, 3:] = 1  # every sample spans the update
    out, grad = ours(mode, logp, prox, behaviour, advantages, mask, lags)
    lagged = mask & (lags > 0)
    plain = mask & ~lagged
    count = int(mask.sum())
    reference = areal_ppo_actor_loss_fn if mode == "mask" else None
    if reference is not None:
        off = reference(logp, prox, behaviour, advantages[:, None], EPS, lagged, CAP)
    else:
        off = trl_grpo_loss(logp, prox, behaviour, advantages, lagged.double(), EPS, CAP)
    off = off * int(lagged.sum()) / count
    on = trl_grpo_loss(logp, behaviour, behaviour, advantages, plain.double(), EPS, math.inf)
    on = on * int(plain.sum()) / count
    (their_grad,) = torch.autograd.grad(off + on, logp)
    assert float(out.loss) == pytest.approx(float(off + on), abs=1e-12)
    assert torch.allclose(grad, their_grad, atol=1e-12)
    assert out.importance["off_tokens"] == int(lagged.sum())


@pytest.fixture(scope="module")
def model():
    return make_pair("qwen2", seed=5, vocab_size=4096, tie_word_embeddings=False)[0]


def test_lagged_tokens_get_the_weights_in_the_update(model):
    """Through `accumulate_gradients`: at the update's forward pi_theta = pi_prox (ratio 1), so
    a lagged token's surrogate is A * min(pi_prox / mu, cap); lag-0 tokens keep the ratio to
    the behaviour log-probs, unweighted, even inside a sample that has lagged ones."""
    base = samples()
    with torch.no_grad():  # behaviour near the model's own log-probs: weights on both sides
        own = packed_response_logprobs(
            model, [s.prompt for s in base], [s.response for s in base], 0.8, 4096
        )
    gen = torch.Generator().manual_seed(1)
    batch = [
        dataclasses.replace(
            s,
            behaviour=(lp + 0.6 * torch.randn(len(lp), generator=gen)).tolist(),
            lags=[int(j >= len(lp) // 2) for j in range(len(lp))] if i % 2 == 0 else None,
        )
        for i, (s, lp) in enumerate(zip(base, own, strict=True))
    ]
    result = accumulate_gradients(
        model, batch, settings(kl_coef=0.0, importance=Importance("truncate", CAP))
    )
    tokens = sum(len(s.response) for s in batch)
    loss, raw = 0.0, []
    for sample, prox in zip(batch, result.logprobs, strict=True):
        lags = sample.lags or [0] * len(prox)
        for lp, mu, lag in zip(prox, sample.behaviour, lags, strict=True):
            a = sample.advantage
            if lag:
                raw.append(math.exp(lp - mu))
                loss -= a * min(raw[-1], CAP) / tokens
            else:
                r = math.exp(lp - mu)
                loss -= min(r * a, min(max(r, 0.8), 1.2) * a) / tokens
    metrics = result.importance_metrics()
    assert result.loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert metrics["is_weight_mean"] == pytest.approx(sum(raw) / len(raw), rel=1e-5)
    assert metrics["is_weight_max"] == pytest.approx(max(raw), rel=1e-5)
    truncated = sum(w > CAP for w in raw) / len(raw)
    assert metrics["is_truncated_fraction"] == pytest.approx(truncated)
    assert 0 < truncated < 1  # the cap is exercised both ways


def test_without_lagged_tokens_the_update_is_exactly_the_synchronous_one(model):
    """Lag 0: the same gradients, bit for bit, as the plain clipped loss against the behaviour
    log-probs (no importance weights at all)."""
    batch = samples()
    model.zero_grad(set_to_none=True)
    result = accumulate_gradients(model, batch, settings(kl_coef=0.0))
    ours_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert result.importance == {}
    model.zero_grad(set_to_none=True)
    logp = packed_response_logprobs(
        model, [s.prompt for s in batch], [s.response for s in batch], 0.8, 4096
    )
    behaviour = pad_sequence([torch.tensor(s.behaviour) for s in batch], batch_first=True)
    mask = pad_sequence([torch.ones(len(s.response), dtype=torch.bool) for s in batch], True)
    advantages = torch.tensor([s.advantage for s in batch])
    tokens = float(sum(len(s.response) for s in batch))
    padded = pad_sequence(logp, batch_first=True)
    ratio = torch.exp(torch.where(mask, padded - behaviour, torch.zeros_like(padded)))
    surrogate = torch.minimum(
        ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None]
    )
    (-(surrogate * mask.float()).sum() / tokens).backward()
    for name, parameter in model.named_parameters():
        assert torch.equal(ours_grads[name], parameter.grad), name
