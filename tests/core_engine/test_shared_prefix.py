"""Cold shared prefixes are computed once: requests admitted together share the full pages of
their common header while it is being prefilled (no warm cache needed), with results equal to
HF's and to the unshared run."""

import pytest
import torch

from core_engine.model import attention
from core_engine.task import SamplingParams
from core_engine.weights import canonical_weights

from .reference import assert_idle, hf_greedy, hf_logprobs, make_engine, make_pair

HEADER = list(range(10, 26))  # 16 tokens: 4 full pages of 4
PROMPTS = [[*HEADER, 40 + i, 60 + i, 80 + i] for i in range(5)]
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def prefill_tokens(engine) -> int:
    return engine.stats()["prefill_tokens"]


def assert_exact(results, hf):
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, 4)
        truth = hf_logprobs(hf, prompt, result.output_ids)
        assert result.output_temp_logprobs == pytest.approx(truth.tolist(), abs=1e-4)


def test_a_cold_header_is_prefilled_once_per_batch(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    results = engine.run_batch(PROMPTS, GREEDY)
    assert_exact(results, hf)
    assert [r.num_cached_prompt_tokens for r in results] == [0, 16, 16, 16, 16]
    assert prefill_tokens(engine) == 16 + 5 * 3  # the header once, every suffix
    assert_idle(engine)


def test_the_header_is_shared_again_after_a_weight_update():
    ours, hf = make_pair("qwen2")
    engine = make_engine(ours, page_size=4)
    engine.run_batch(PROMPTS, GREEDY)
    gen = torch.Generator().manual_seed(3)
    new = {
        n: t + 0.05 * torch.randn(t.shape, generator=gen)
        for n, t in canonical_weights(ours).items()
    }
    engine.update_weights(new, 1)
    hf.load_state_dict(ours.state_dict())
    before = prefill_tokens(engine)
    results = engine.run_batch(PROMPTS, GREEDY)  # cold: the update invalidated the cache
    assert all(r.policy_version == 1 for r in results)
    assert_exact(results, hf)
    assert prefill_tokens(engine) - before == 16 + 5 * 3
    assert_idle(engine)


def test_shared_results_equal_the_unshared_run(qwen2_pair):
    ours, _ = qwen2_pair
    shared = make_engine(ours, page_size=4).run_batch(PROMPTS, GREEDY)
    one_by_one = make_engine(ours, page_size=4, max_batch_size=1)
    alone = [one_by_one.run_batch([p], GREEDY)[0] for p in PROMPTS]
    assert [r.output_ids for r in shared] == [r.output_ids for r in alone]
    for s, a in zip(shared, alone, strict=True):
        assert s.output_temp_logprobs == pytest.approx(a.output_temp_logprobs, abs=1e-5)


def test_pages_of_a_failed_prefill_are_never_hit(qwen2_pair, monkeypatch):
    """A prefill that dies after writing garbage K/V leaves no cache entry behind."""
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    real = engine.executor.forward_prefill

    def garbage_then_raise(tasks):
        real(tasks)
        engine.pool.buffer.k.fill_(float("nan"))
        raise RuntimeError("died mid-prefill")

    monkeypatch.setattr(engine.executor, "forward_prefill", garbage_then_raise)
    failed = engine.run_batch(PROMPTS, GREEDY)
    assert {r.error.code.value for r in failed} == {"internal"}
    assert engine.stats()["pages_cached"] == 0
    monkeypatch.undo()
    assert_exact(engine.run_batch(PROMPTS, GREEDY), hf)
    assert_idle(engine)


LONG_HEADER = [10 + i % 100 for i in range(256)]  # decode reads it once for every row
LONG_PROMPTS = [[*LONG_HEADER, 70 + i, 90 + i][: len(LONG_HEADER) + 1 + i % 2] for i in range(5)]


def test_decode_attends_a_shared_header_once_with_results_equal_to_hf(qwen2_pair, monkeypatch):
    ours, hf = qwen2_pair
    calls = []
    real = attention.cascade_decode

    def spy(q, k_cache, v_cache, meta, scale):
        calls.append((meta.shared_prefix, len(meta.context_lens)))
        return real(q, k_cache, v_cache, meta, scale)

    monkeypatch.setattr(attention, "cascade_decode", spy)
    engine = make_engine(ours, page_size=4)
    sampling = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    results = engine.run_batch(LONG_PROMPTS, sampling)
    assert calls and all(shared >= 256 and rows == 5 for shared, rows in calls)
    for prompt, result in zip(LONG_PROMPTS, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, 6)
        truth = hf_logprobs(hf, prompt, result.output_ids)
        assert result.output_temp_logprobs == pytest.approx(truth.tolist(), abs=1e-4)
    assert_idle(engine)


def test_cascade_decode_equals_one_attention_over_the_whole_context():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, slots = 8, 2, 16, 64
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen)
    lens = torch.tensor([20, 23, 21])
    gather = torch.stack([torch.arange(23), torch.arange(30, 53), torch.arange(40, 63)])
    gather[:, :18] = torch.arange(18)  # 18 shared slots, then each row's own
    q = torch.randn(3, heads, dim, generator=gen)
    mask = (torch.arange(23)[None, :] < lens[:, None])[:, None, None, :]
    meta = attention.AttentionMetadata(
        slot_mapping=torch.zeros(3, dtype=torch.long),
        query_lens=[1, 1, 1],
        context_lens=lens.tolist(),
        gather_index=gather,
        decode_mask=mask,
        shared_prefix=18,
    )
    keys = attention.gather_slots(k_cache, gather).transpose(1, 2)
    values = attention.gather_slots(v_cache, gather).transpose(1, 2)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask, scale=0.25, enable_gqa=True
    ).squeeze(2)
    got = attention.cascade_decode(q, k_cache, v_cache, meta, 0.25)
    assert torch.allclose(got, expected, atol=1e-6)
