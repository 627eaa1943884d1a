"""The engine's oneDNN matmul: used by engine forwards alone (per thread), for products large
enough, with results equal to `F.linear`'s up to rounding, and the engine still equal to
Hugging Face (greedy tokens, teacher-forced log-probs)."""

import threading

import pytest
import torch
import torch.nn.functional as F

from core_engine.model.kernels import MIN_MULTIPLY_ADDS, Linear, engine_kernels, onednn_available
from core_engine.task import SamplingParams

from .reference import hf_greedy, hf_logprobs, make_engine, make_pair

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")
ONEDNN_OP = "mkldnn::_linear_pointwise"


def ops_run(fn) -> set[str]:
    with torch.profiler.profile() as profile:
        fn()
    return {event.key for event in profile.key_averages()}


def test_engine_products_use_onednn_and_agree_with_f_linear():
    torch.manual_seed(0)
    layer = Linear(256, 1024)
    x = torch.randn(16, 256)  # 4M multiply-adds
    with torch.inference_mode():
        reference = F.linear(x, layer.weight, layer.bias)
        with engine_kernels():
            assert ONEDNN_OP in ops_run(lambda: layer(x))
            out = layer(x)
        small = torch.randn(1, 256)  # 262k: below the threshold, F.linear
        assert MIN_MULTIPLY_ADDS > 1 * 256 * 1024
        with engine_kernels():
            assert ONEDNN_OP not in ops_run(lambda: layer(small))
    assert torch.allclose(out, reference, rtol=1e-5, atol=1e-5)
    assert ONEDNN_OP not in ops_run(lambda: layer(x))  # outside the engine: F.linear


def test_the_switch_is_per_thread_and_training_keeps_autograd():
    layer = Linear(256, 1024)
    x = torch.randn(16, 256, requires_grad=True)
    seen = {}

    def other_thread():
        seen["ops"] = ops_run(lambda: layer(x).sum().backward())

    with engine_kernels():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert ONEDNN_OP not in seen["ops"] and x.grad is not None


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
