"""AdamW with bfloat16 moments against torch's fp32 AdamW."""

import pytest
import torch

from core_engine.rl.trainer import optimizer as optimizer_module
from core_engine.rl.trainer.optimizer import BF16StateAdamW, build_optimizer

from .test_rl_trainer import make_trainer


def parameters(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(300, 7), (11,), (5,)]
    ]


def gradients(step, params):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def run(make, steps):
    params = parameters()
    opt = make(params)
    for step in range(steps):
        for p, g in zip(params, gradients(step, params), strict=True):
            p.grad = g
        opt.step()
    return params, opt


def reference(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=False)


def ours(params):
    return BF16StateAdamW(params, lr=1e-2, weight_decay=0.1)


def test_the_first_step_equals_fp32_adamw():
    start = parameters()
    expected, _ = run(reference, 1)
    got, _ = run(ours, 1)
    for s, e, g in zip(start, expected, got, strict=True):
        assert torch.allclose(g - s, e - s, rtol=1e-5, atol=1e-7)


def test_later_steps_differ_from_fp32_adamw_only_by_the_moments_rounding():
    start = parameters()
    expected, fp32 = run(reference, 20)
    got, bf16 = run(ours, 20)
    for s, e, g in zip(start, expected, got, strict=True):
        moved = (e - s).abs().max()
        assert (g - e).abs().max() <= 0.02 * moved
    for param in got:
        assert bf16.state[param]["exp_avg"].dtype == torch.bfloat16
        assert bf16.state[param]["exp_avg_sq"].dtype == torch.bfloat16
    assert float(bf16.state[got[0]]["step"]) == float(fp32.state[expected[0]]["step"]) == 20


def test_chunks_change_nothing(monkeypatch):
    whole, _ = run(ours, 5)
    monkeypatch.setattr(optimizer_module, "CHUNK", 64)  # smaller than the 2,100-element tensor
    chunked, _ = run(ours, 5)
    for a, b in zip(whole, chunked, strict=True):
        assert torch.equal(a, b)


def test_fp32_moments_use_torchs_fused_adamw():
    opt = build_optimizer(parameters(), 1e-3, 0.0, "float32")
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"]
    with pytest.raises(ValueError, match="optimizer_state_dtype"):
        build_optimizer(parameters(), 1e-3, 0.0, "int8")


def test_a_bf16_moment_run_resumes_exactly(checkpoint, tmp_path):
    """Checkpointed bf16 moments load back bit for bit: stop after one step, resume, and the
    second step equals an uninterrupted run's."""
    settings = dict(optimizer_state_dtype="bfloat16", steps=2, drop_zero_variance_groups=False)
    straight = make_trainer(checkpoint, tmp_path / "a", **settings)
    straight.train()
    first = make_trainer(checkpoint, tmp_path / "b", **{**settings, "steps": 1})
    first.train()
    resumed = make_trainer(checkpoint, tmp_path / "b", **settings)
    assert isinstance(resumed.optimizer, BF16StateAdamW)
    resumed.train()
    for (name, a), b in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
