"""The decoder's oneDNN matmul: for fp32 CPU products large enough, forward and backward,
with results and gradients equal to `F.linear`'s up to rounding, and the engine still equal to
Hugging Face (greedy tokens, teacher-forced log-probs)."""

import pytest
import torch
import torch.nn.functional as F

from core_engine.model.kernels import (
    MIN_MULTIPLY_ADDS,
    MIN_WEIGHT_GRADIENT_ROWS,
    Linear,
    onednn_available,
)
from core_engine.task import SamplingParams

from .reference import hf_greedy, hf_logprobs, make_engine, make_pair

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")
ONEDNN_OP = "mkldnn::_linear_pointwise"


def ops_run(fn) -> set[str]:
    with torch.profiler.profile() as profile:
        fn()
    return {event.key for event in profile.key_averages()}


def test_large_products_use_onednn_and_agree_with_f_linear():
    torch.manual_seed(0)
    layer = Linear(256, 1024)
    x = torch.randn(16, 256)  # 4M multiply-adds
    with torch.inference_mode():
        reference = F.linear(x, layer.weight, layer.bias)
        assert ONEDNN_OP in ops_run(lambda: layer(x))
        out = layer(x)
        small = torch.randn(1, 256)  # 262k: below the threshold, F.linear
        assert MIN_MULTIPLY_ADDS > 1 * 256 * 1024
        assert ONEDNN_OP not in ops_run(lambda: layer(small))
        double = Linear(256, 1024).double()
        assert ONEDNN_OP not in ops_run(lambda: double(x.double()))  # fp32 only
    assert torch.allclose(out, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [MIN_WEIGHT_GRADIENT_ROWS // 4, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_training_products_and_their_gradients_equal_float64_autograd(rows, bias):
    """Forward and both backward products through oneDNN (the weight gradient by `mm` when
    it sums over few rows), a 3-d input, and the expanded gradient of a sum: all equal to
    float64 autograd of `F.linear`."""
    torch.manual_seed(rows)
    layer = Linear(384, 512, bias=bias)
    x = torch.randn(2, rows, 384, requires_grad=True)
    weights = torch.randn(2, rows, 512)
    ops = ops_run(lambda: ((layer(x) * weights).sum() + layer(x).sum()).backward())
    assert ONEDNN_OP in ops
    assert ("aten::mm" in ops) == (2 * rows < MIN_WEIGHT_GRADIENT_ROWS)

    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_() if bias else None
    ((F.linear(x64, w64, b64) * weights.double()).sum() + F.linear(x64, w64, b64).sum()).backward()
    for ours, truth in [(x.grad, x64.grad), (layer.weight.grad, w64.grad)] + (
        [(layer.bias.grad, b64.grad)] if bias else []
    ):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours.double(), truth, rtol=1e-5, atol=1e-4)


def test_a_frozen_weight_gets_no_gradient_and_the_input_does():
    layer = Linear(256, 1024).requires_grad_(False)  # a LoRA base layer
    x = torch.randn(64, 256, requires_grad=True)
    layer(x).pow(2).sum().backward()
    assert layer.weight.grad is None and x.grad is not None
    x64 = x.detach().double().requires_grad_()
    F.linear(x64, layer.weight.double(), layer.bias.double()).pow(2).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-4)


def test_a_mid_size_engine_equals_hugging_face_through_onednn():
    """Products of this model cross the threshold (hidden 256, MLP 1024, 4,096 tokens)."""
    ours, hf = make_pair(
        "qwen2",
        seed=3,
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=4,
        initializer_range=0.05,
    )
    engine = make_engine(ours, page_size=16)
    prompts = [[5 + i, 17, 300 + 7 * i, 2048, 9, 1000 + i, 77, 3] for i in range(6)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ops = ops_run(lambda: engine.run_batch(prompts[:1], greedy))
    assert ONEDNN_OP in ops
    results = engine.run_batch(prompts, greedy)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, 12)
        truth = hf_logprobs(hf, prompt, result.output_ids)
        assert torch.allclose(torch.tensor(result.output_temp_logprobs), truth, atol=1e-4)
