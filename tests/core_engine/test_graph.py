"""CUDA-graph decode: never needed on CPU; on CUDA it equals eager decode, weight updates too."""

import pytest
import torch

from core_engine.runtime.graph import graphs_supported
from core_engine.task import SamplingParams
from core_engine.weights import canonical_weights

from .reference import make_engine, make_pair

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]


def test_cpu_engine_runs_eager_without_touching_cuda(qwen2_pair):
    engine = make_engine(qwen2_pair[0])
    assert not graphs_supported(engine.executor.device)
    assert engine.executor.graph is None


def cuda_pair(dtype):
    ours, hf = make_pair("qwen2")
    return ours.to("cuda", dtype), hf


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_decode_equals_eager_decode(dtype):
    model, _ = cuda_pair(dtype)
    graphed = make_engine(model, max_batch_size=6, page_size=4)
    eager = make_engine(model, max_batch_size=6, page_size=4, cuda_graph=False)
    assert graphed.executor.graph is not None and eager.executor.graph is None
    for a, b in zip(
        graphed.run_batch(PROMPTS, GREEDY), eager.run_batch(PROMPTS, GREEDY), strict=True
    ):
        assert a.output_ids == b.output_ids
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert torch.allclose(
            torch.tensor(a.output_temp_logprobs), torch.tensor(b.output_temp_logprobs), atol=tol
        )


@needs_cuda
@pytest.mark.cuda
def test_graph_replay_sees_in_place_weight_updates():
    model, _ = cuda_pair(torch.float32)
    engine = make_engine(model, max_batch_size=4, page_size=4)
    gen = torch.Generator(device="cuda").manual_seed(0)
    new = {
        k: v + 0.1 * torch.randn(v.shape, device="cuda", generator=gen)
        for k, v in canonical_weights(model).items()
    }
    engine.update_weights(new, 1)
    fresh_model, _ = cuda_pair(torch.float32)
    with torch.no_grad():
        for name, tensor in canonical_weights(fresh_model).items():
            tensor.copy_(new[name])
    fresh = make_engine(fresh_model, max_batch_size=4, page_size=4, cuda_graph=False)
    for a, b in zip(
        engine.run_batch(PROMPTS, GREEDY), fresh.run_batch(PROMPTS, GREEDY), strict=True
    ):
        assert a.output_ids == b.output_ids and a.policy_version == 1
