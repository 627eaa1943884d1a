"""Reference helpers: our tiny models, their Hugging Face twins, and idle-state checks."""

from __future__ import annotations

import torch
import transformers

from core_engine.model import CausalLM, build_model, load_state
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.toy import tiny_config

ARCHS = ("llama", "qwen2", "qwen3")


def make_pair(arch: str = "qwen2", seed: int = 0, **overrides) -> tuple[CausalLM, torch.nn.Module]:
    """Our model and a Hugging Face model with identical random weights."""
    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    ours = build_model(config)
    load_state(ours, hf.state_dict())
    return ours, hf


def make_engine(model: CausalLM, **config) -> InferenceScheduler:
    return InferenceScheduler(model, EngineConfig(**config))


def hf_greedy(hf, prompt: list[int], new_tokens: int) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=new_tokens,  # no min_new_tokens: it would suppress the config's EOS id
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def assert_gradients_equal(ours: dict[str, torch.Tensor], reference: torch.nn.Module) -> None:
    """Each of our gradients equals the reference model's up to fp32 summation order: within
    1e-5 of the reference tensor's largest entry (at least 1e-5). CPUs differ in the kernels
    they pick, so the order of a sum differs, and an entry near zero among entries of order 10
    carries their rounding: an elementwise tolerance fails on one machine and passes on the next."""
    theirs = dict(reference.named_parameters())
    for name, grad in ours.items():
        expected = theirs[name].grad
        scale = max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5 * scale, msg=name)


@torch.no_grad()
def hf_logprobs(hf, prompt: list[int], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced log-probs of `output` after `prompt` under the HF model."""
    logits = hf(torch.tensor([prompt + output])).logits[0].float() / temperature
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(output)[:, None])[:, 0]


def assert_idle(engine: InferenceScheduler) -> None:
    """Pool, request slots and in-flight metrics are exactly back to idle."""
    engine.check_integrity()
    assert engine.is_idle()
    assert engine.pool.req_pool.num_free == engine.pool.req_pool.max_requests
    usage = engine.pool.strategy.usage()
    assert usage["pages_used"] == 0
    assert engine.metrics.in_flight == 0
