"""Rewards and their validation; GRPO advantages and loss against hand computations."""

import math

import pytest
import torch

from core_engine.rl.objective.advantages import advantages, zero_variance_groups
from core_engine.rl.objective.loss import policy_loss
from core_engine.rl.rewards import RewardError, resolve_reward, score


def test_builtin_rewards():
    assert resolve_reward("exact_match")([" 7 ", "8"], ["7", "7"], ["", ""]) == [1.0, 0.0]
    assert resolve_reward("numeric_match")(["= 12.0", "x"], ["12", "3"], ["", ""]) == [1.0, 0.0]
    assert resolve_reward(r"regex:\d+")(["123", "12a"], ["", ""], ["", ""]) == [1.0, 0.0]


def test_unknown_reward_specs_are_explained():
    with pytest.raises(ValueError, match="unknown reward"):
        resolve_reward("nope")
    with pytest.raises(ValueError, match="not allowed"):
        resolve_reward("math:isclose")
    with pytest.raises(ValueError, match="invalid regular expression"):
        resolve_reward("regex:(")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda c, r, p: 1 / 0, "raised ZeroDivisionError"),
        (lambda c, r, p: [1.0], "returned 1 values for 2"),
        (lambda c, r, p: [1.0, float("nan")], "non-finite"),
        (lambda c, r, p: ["a", 1.0], "must be numbers"),
    ],
)
def test_bad_reward_output_raises_reward_error(fn, message):
    with pytest.raises(RewardError, match=message):
        score(fn, ["a", "b"], ["a", "b"], ["", ""])


def test_group_advantages_normalise_per_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv, zero_var = advantages(rewards, torch.ones_like(rewards)), zero_variance_groups(rewards)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4))
    assert zero_var.tolist() == [False, True]


def test_loss_is_token_averaged_and_clipped():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.25], [0.9, 0.1]]))
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True], [True, False]])
    out = policy_loss(logp, behaviour, behaviour, adv, mask, clip_eps=0.2)
    # ratios: row0 = [1, 2 -> clipped 1.2]; row1 = [1]; token mean of -(r * A)
    expected = -(1.0 * 1 + 1.2 * 1 + 1.0 * -2) / 3
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.clip_fraction == pytest.approx(1 / 3)


def test_k3_kl_to_reference():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    out = policy_loss(
        logp,
        logp.detach(),
        logp.detach(),
        torch.zeros(1),
        torch.ones(1, 1, dtype=torch.bool),
        kl_coef=0.1,
        ref_logp=ref,
    )
    delta = math.log(0.25) - math.log(0.5)
    k3 = math.exp(delta) - delta - 1
    assert out.kl == pytest.approx(k3, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.1 * k3, abs=1e-6)


def test_masked_tokens_get_no_gradient():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    zeros = torch.zeros(2, 3)
    policy_loss(logp, zeros, zeros, torch.tensor([1.0, 5.0]), mask).loss.backward()
    assert logp.grad[0, 0] != 0 and torch.count_nonzero(logp.grad) == 1
