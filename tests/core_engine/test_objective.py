"""The policy objective against the formulas of the peers it names, as their sources write them:
AReaL's `ppo_actor_loss_fn` (the `mask` mode: decoupled PPO, tokens whose pi_prox / pi_behaviour
exceeds the cap drop out) and TRL's GRPO loss with `vllm_importance_sampling_correction` in
`token_truncate` mode (the `truncate` mode: the weight is capped). Per-token behaviour lag
decides which tokens are corrected (in flight, every token from a sample's first older-version
token on); without any, the loss is exactly the synchronous one."""

import dataclasses
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.rl.objective.logprobs import packed_response_logprobs
from core_engine.rl.objective.loss import Importance, policy_loss
from core_engine.rl.objective.update import TrainSample, accumulate_gradients
from core_engine.rl.rollout import RolloutResult
from core_engine.rl.trainer.metrics import behaviour_lags, kv_mixture_metrics, token_lags
from core_engine.rl.trainer.screen import train_samples

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


def in_flight_rollout(base, behaviour, token_versions, resumed_at, trainer_version):
    """`base`'s samples as one group of an in-flight rollout whose tokens carry
    `token_versions` (runs of [version, count]) and `resumed_at` (recomputes)."""
    n = len(base)
    return RolloutResult(
        prompts=["p"],
        messages=[[]],
        references=[""],
        prompt_ids=[base[0].prompt],
        response_ids=[s.response for s in base],
        completions=[""] * n,
        behaviour_logprobs=behaviour,
        temp_logprobs=behaviour,
        finish_reasons=["length"] * n,
        errors=[None] * n,
        cached_prompt_tokens=[0] * n,
        seeds=list(range(n)),
        policy_version=min(runs[0][0] for runs in token_versions),
        group_size=n,
        temperature=0.8,
        token_versions=token_versions,
        resumed_at=resumed_at,
        rewards=[0.0] * n,
    )


def test_tokens_after_an_in_flight_update_are_corrected_until_a_recompute():
    """An update lands mid-sequence: the tokens the new version samples read K/V the old one
    wrote, so every token from the sample's first older-version token on is corrected, up to a
    recompute of the whole context (`resumed_at`: a preemption's resume, an episode's turn)."""
    base = [TrainSample([5, 6], list(range(7)), [0.0] * 7, 0.0)] * 5
    rollout = in_flight_rollout(
        base,
        [[0.0] * 7] * 5,
        [[[3, 2], [4, 5]], [[3, 2], [4, 5]], [[4, 7]], [[3, 7]], [[3, 2], [4, 5]]],
        [[], [5], [], [], [1]],  # sample 4 resumed before its update: still mixed after it
        4,
    )
    lags = [behaviour_lags(rollout, i, 4) for i in range(5)]
    assert lags == [
        [1] * 7,  # spans the update: the lag-0 tokens after it are corrected too
        [1] * 5 + [0] * 2,  # recomputed by version 4 at token 5: whole again from there
        [0] * 7,  # version 4's own, start to end
        [1] * 7,
        [1] * 7,
    ]
    assert [token_lags(rollout, i, 4) for i in range(2)] == [[1, 1, 0, 0, 0, 0, 0]] * 2


def spanning_update(mode):
    """A batch whose samples span an update (versions 3 then 4, the trainer at 4; sample 2 is
    version 4's alone, sample 4 recomputed for its last token), trained through
    `train_samples` and `accumulate_gradients` in several micro-batches: (rollout, behaviour
    log-probs, advantages, `UpdateResult`)."""
    model = make_pair("qwen2", seed=5, vocab_size=4096, tie_word_embeddings=False)[0]
    base = [dataclasses.replace(s, prompt=samples()[0].prompt) for s in samples(count=6)]
    with torch.no_grad():
        own = packed_response_logprobs(
            model, [s.prompt for s in base], [s.response for s in base], 0.8, 4096
        )
    gen = torch.Generator().manual_seed(1)
    behaviour = [(lp + 0.6 * torch.randn(len(lp), generator=gen)).tolist() for lp in own]
    lengths = [len(s.response) for s in base]
    spans = [[[3, 1], [4, n - 1]] if n > 1 else [[3, 1]] for n in lengths]
    spans[2], spans[3] = [[4, lengths[2]]], [[3, lengths[3]]]
    resumed = [[] for _ in base]
    resumed[4] = [lengths[4] - 1]  # recomputed by version 4 for its last token
    rollout = in_flight_rollout(base, behaviour, spans, resumed, 4)
    advantages = [s.advantage for s in base]
    batch = train_samples(rollout, list(range(len(base))), advantages, {}, trainer_version=4)
    result = accumulate_gradients(
        model, batch, settings(kl_coef=0.0, max_tokens=20, importance=Importance(mode, CAP))
    )
    assert result.micro_batches > 1
    return rollout, behaviour, advantages, result


def spanning_tokens(trainer, behaviour):
    """`spanning_update`'s tokens, float64 [N, T]: pi_prox (the trainer's log-probs), mu, the
    mask, and the tokens to correct (from a spanning sample's first token to its end or its
    recompute)."""
    lengths = [len(row) for row in behaviour]
    width = max(lengths)

    def padded(rows):
        return torch.tensor([[*r, *[0.0] * (width - len(r))] for r in rows], dtype=torch.float64)

    mask = padded([[1.0] * n for n in lengths]).bool()
    corrected = torch.zeros_like(mask)
    for i, n in enumerate(lengths):
        if i != 2:
            corrected[i, : n - 1 if i == 4 else n] = True
    return padded(trainer), padded(behaviour), mask, corrected


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_the_in_flight_objective_is_areals_decoupled_loss_on_a_spanning_sample(mode):
    """A batch whose samples span an update (versions 3 then 4, the trainer at 4), trained
    through `train_samples` and `accumulate_gradients` with the tokens in several micro-batches:
    its loss equals a float64 computation in which every token from a sample's first older one
    on (until its recompute) takes AReaL's decoupled loss (pi_prox the trainer's, the behaviour
    weight under `mode`), and the others the synchronous one; the K/V-mixture gap is the mean
    |pi_prox - mu| over the version-4 tokens that read version-3 K/V."""
    rollout, behaviour, advantages, result = spanning_update(mode)
    lengths = [len(row) for row in behaviour]
    rows = list(range(len(lengths)))
    prox, mu, mask, corrected = spanning_tokens(result.logprobs, behaviour)
    adv = torch.tensor(advantages, dtype=torch.float64)[:, None]
    count = int(mask.sum())
    if mode == "mask":
        off = areal_ppo_actor_loss_fn(prox, prox, mu, adv, EPS, corrected, CAP)
    else:
        off = trl_grpo_loss(prox, prox, mu, adv.squeeze(1), corrected.double(), EPS, CAP)
    plain = mask & ~corrected
    on = trl_grpo_loss(prox, mu, mu, adv.squeeze(1), plain.double(), EPS, math.inf)
    expected = off * int(corrected.sum()) / count + on * int(plain.sum()) / count
    assert result.loss == pytest.approx(float(expected), rel=1e-5, abs=1e-6)
    mixed = corrected.clone()
    mixed[:, 0] = False  # version 3 sampled the first token of every spanning sample
    mixed[3] = False  # ... and all of sample 3
    gap = (prox - mu).abs()[mixed]
    metrics = kv_mixture_metrics(rollout, rows, result.logprobs, 4)
    assert metrics["kv_mixture_tokens"] == int(mixed.sum())
    assert metrics["kv_mixture_gap_mean"] == pytest.approx(float(gap.mean()), rel=1e-6)
    assert metrics["kv_mixture_gap_max"] == pytest.approx(float(gap.max()), rel=1e-6)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_the_loss_records_what_it_did_to_each_token_of_a_spanning_batch(mode):
    """The per-sample `TokenRecord`s of `spanning_update` equal a float64 computation: the
    tokens from a spanning sample's first older one on are corrected, with ratio pi_theta /
    pi_prox (1 at the update's forward) and weight min(w, cap) (truncate) or w, 0 over the cap
    (mask), w = pi_prox / mu; the others have ratio pi_theta / mu and weight 1; clipped where
    PPO's clip is active; trained: every response token."""
    _, behaviour, advantages, result = spanning_update(mode)
    prox, mu, mask, corrected = spanning_tokens(result.logprobs, behaviour)
    adv = torch.tensor(advantages, dtype=torch.float64)[:, None]
    ratio = torch.where(corrected, torch.ones_like(prox), torch.exp(prox - mu))
    w = torch.exp(prox - mu)
    capped = w.clamp(max=CAP) if mode == "truncate" else torch.where(w <= CAP, w, 0.0)
    weight = torch.where(corrected, capped, torch.ones_like(w))
    low = (ratio < 1 - EPS) & (adv < 0)
    high = (ratio > 1 + EPS) & (adv > 0)
    clipped = (low | high) & mask
    records = result.token_records
    assert [len(r.ratios) for r in records] == [len(row) for row in behaviour]
    for i, (record, n) in enumerate(zip(records, map(len, behaviour), strict=True)):
        assert record.ratios == pytest.approx(ratio[i, :n].tolist(), rel=1e-5)
        assert record.weights == pytest.approx(weight[i, :n].tolist(), rel=1e-5)
        assert record.corrected == corrected[i, :n].tolist()
        assert record.clipped == clipped[i, :n].tolist()
        assert record.trained == [True] * n
    assert clipped.any() and (corrected & (w > CAP)).any()  # the case is not vacuous


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
