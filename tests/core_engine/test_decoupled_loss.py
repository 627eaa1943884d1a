"""The decoupled PPO objective for off-policy samples (AReaL): clip on pi_theta / pi_proximal,
weighted by min(pi_proximal / pi_behaviour, cap); against float64 hand calculations. Without
off-policy samples the loss is exactly the synchronous one."""

import dataclasses
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.rl.logprobs import packed_response_logprobs
from core_engine.rl.loss import grpo_loss
from core_engine.rl.update import accumulate_gradients

from .reference import make_pair
from .test_rl_scale import samples, settings

CAP = 1.5


def test_grpo_loss_with_proximal_ratio_and_weights_equals_a_float64_hand_sum():
    gen = torch.Generator().manual_seed(3)
    n, t, eps = 4, 5, 0.2
    logp = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    prox = logp + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    behaviour = prox + 0.5 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 3:] = mask[3, 1:] = False
    weights = torch.exp(prox - behaviour).clamp(max=CAP)
    logp.requires_grad_(True)
    out = grpo_loss(logp, prox, advantages, mask, eps, 0.0, None, 11.0, weights)
    out.loss.backward()
    loss, grads = 0.0, torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                continue
            a = float(advantages[i])
            r = math.exp(float(logp[i, j]) - float(prox[i, j]))
            w = min(math.exp(float(prox[i, j]) - float(behaviour[i, j])), CAP)
            unclipped, clipped = r * a, min(max(r, 1 - eps), 1 + eps) * a
            loss -= min(unclipped, clipped) * w / 11.0
            if unclipped <= clipped:  # the unclipped term is the minimum: it carries gradient
                grads[i, j] = -r * a * w / 11.0
    assert float(out.loss) == pytest.approx(loss, abs=1e-12)
    assert torch.allclose(logp.grad, grads, atol=1e-12)


@pytest.fixture(scope="module")
def model():
    return make_pair("qwen2", seed=5, vocab_size=4096, tie_word_embeddings=False)[0]


def test_off_policy_samples_get_the_decoupled_weights_in_the_update(model):
    """Through `accumulate_gradients`: at the update's forward pi_theta = pi_proximal (ratio 1),
    so an off-policy token's surrogate is A * min(pi_proximal / pi_behaviour, cap); on-policy
    tokens keep the ratio to the behaviour log-probs, unweighted."""
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
            off_policy=i % 2 == 0,
        )
        for i, (s, lp) in enumerate(zip(base, own, strict=True))
    ]
    result = accumulate_gradients(model, batch, settings(kl_coef=0.0, decoupled_cap=CAP))
    tokens = sum(len(s.response) for s in batch)
    loss, raw = 0.0, []
    for sample, prox in zip(batch, result.logprobs, strict=True):
        for lp, mu in zip(prox, sample.behaviour, strict=True):
            a = sample.advantage
            if sample.off_policy:
                raw.append(math.exp(lp - mu))
                loss -= a * min(raw[-1], CAP) / tokens
            else:
                r = math.exp(lp - mu)
                loss -= min(r * a, min(max(r, 0.8), 1.2) * a) / tokens
    assert result.loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert result.is_weight_mean == pytest.approx(sum(raw) / len(raw), rel=1e-5)
    assert result.is_weight_max == pytest.approx(max(raw), rel=1e-5)
    truncated = sum(w > CAP for w in raw) / len(raw)
    assert result.is_truncated_fraction == pytest.approx(truncated)
    assert 0 < truncated < 1  # the cap is exercised both ways


def test_without_off_policy_samples_the_update_is_exactly_the_synchronous_one(model):
    """Lag 0: the same gradients, bit for bit, as the plain GRPO loss against the behaviour
    log-probs (no importance weights at all)."""
    batch = samples()
    model.zero_grad(set_to_none=True)
    result = accumulate_gradients(model, batch, settings(kl_coef=0.0))
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert result.is_weight_mean is None
    model.zero_grad(set_to_none=True)
    logp = packed_response_logprobs(
        model, [s.prompt for s in batch], [s.response for s in batch], 0.8, 4096
    )
    behaviour = pad_sequence([torch.tensor(s.behaviour) for s in batch], batch_first=True)
    mask = pad_sequence([torch.ones(len(s.response), dtype=torch.bool) for s in batch], True)
    advantages = torch.tensor([s.advantage for s in batch])
    tokens = float(sum(len(s.response) for s in batch))
    out = grpo_loss(
        pad_sequence(logp, batch_first=True), behaviour, advantages, mask, 0.2, 0.0, None, tokens
    )
    out.loss.backward()
    for name, parameter in model.named_parameters():
        assert torch.equal(ours[name], parameter.grad), name
