"""Greedy tokens and log-probs of `run_batch` equal Hugging Face's, in every configuration."""

import pytest
import torch

from core_engine.task import SamplingParams

from .reference import assert_idle, hf_greedy, hf_logprobs, make_engine

PROMPTS = [
    [5, 17, 33, 2, 9],
    [7, 8, 9],
    list(range(10, 31)),
    [3],
    [40, 41, 42, 43, 44, 45, 46, 47],
]
GREEDY_32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def check_against_hf(hf, prompts, results, new_tokens=32):
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf, prompt, new_tokens)
        ref = hf_logprobs(hf, prompt, result.output_ids)
        assert torch.allclose(torch.tensor(result.output_temp_logprobs), ref, atol=1e-4)
        assert result.output_logprobs == [0.0] * new_tokens  # greedy: point mass


@pytest.mark.parametrize("strategy", ["paged", "contiguous"])
def test_greedy_and_logprobs_match_transformers(arch_pair, strategy):
    _, ours, hf = arch_pair
    engine = make_engine(ours, max_batch_size=8, kv_strategy=strategy, page_size=4)
    results = engine.run_batch(PROMPTS, GREEDY_32)
    check_against_hf(hf, PROMPTS, results)
    assert all(r.finish_reason == "length" for r in results)
    assert_idle(engine)


def test_sampled_logprobs_match_teacher_forcing(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    params = SamplingParams(temperature=0.7, max_tokens=24, ignore_eos=True, seed=11)
    for prompt, result in zip(PROMPTS, engine.run_batch(PROMPTS, params), strict=True):
        ref = hf_logprobs(hf, prompt, result.output_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(result.output_temp_logprobs), ref, atol=1e-4)
        assert torch.allclose(torch.tensor(result.output_logprobs), ref, atol=1e-4)


def test_preemption_keeps_results_exact(qwen2_pair):
    ours, hf = qwen2_pair
    # 14 pages of 4 tokens cannot hold four 35-53-token sequences at once: preemption.
    engine = make_engine(ours, max_batch_size=4, page_size=4, num_pages=14)
    results = engine.run_batch(PROMPTS, GREEDY_32)
    assert sum(r.num_preemptions for r in results) > 0
    assert engine.stats()["preemptions"] > 0
    check_against_hf(hf, PROMPTS, results)
    assert_idle(engine)


def test_waves_return_every_result_in_order(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, max_batch_size=2, page_size=4)
    prompts = [[i + 1, i + 2, i + 3] for i in range(7)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    results = engine.run_batch(prompts, params)
    assert len(results) == 7
    for prompt, result in zip(prompts, results, strict=True):
        assert result.prompt_ids == prompt
        assert result.output_ids == hf_greedy(hf, prompt, 8)
    assert_idle(engine)


def test_prefix_hits_keep_results_exact(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    shared = list(range(50, 63))
    prompts = [[*shared, 1], [*shared, 2, 3]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    first = engine.run_batch(prompts[:1], params)
    second = engine.run_batch(prompts, params)
    assert first[0].num_cached_prompt_tokens == 0
    assert [r.num_cached_prompt_tokens for r in second] == [12, 12]
    check_against_hf(hf, prompts, second, new_tokens=16)


def test_first_decode_after_prefill_uses_per_task_positions(qwen2_pair):
    """Prefill then decode in separate steps: the first decode position is len(prompt)."""
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    tasks = engine.make_tasks([[9, 8, 7, 6, 5]], params)
    engine.enqueue(tasks)
    engine.step()  # prefill: first token
    assert tasks[0].num_computed_tokens == 5 and len(tasks[0].output_ids) == 1
    engine.step()  # first decode
    engine.step()
    assert tasks[0].output_ids == hf_greedy(hf, [9, 8, 7, 6, 5], 3)


def test_freed_slot_reused_by_a_new_task(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, max_batch_size=1, kv_strategy="contiguous")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    long_first = engine.run_batch([list(range(1, 30))], params)[0]
    short_next = engine.run_batch([[4, 5]], params)[0]
    assert long_first.output_ids == hf_greedy(hf, list(range(1, 30)), 6)
    assert short_next.output_ids == hf_greedy(hf, [4, 5], 6)


def test_interleaved_callers_join_a_running_batch(qwen2_pair):
    """A task admitted while another is mid-decode gets its own positions."""
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a = engine.make_tasks([[11, 12, 13, 14, 15, 16, 17]], params)
    engine.enqueue(a)
    for _ in range(4):
        engine.step()
    b = engine.make_tasks([[21, 22]], params)
    engine.enqueue(b)
    while not (a[0].finished and b[0].finished):
        engine.step()
    assert a[0].output_ids == hf_greedy(hf, [11, 12, 13, 14, 15, 16, 17], 10)
    assert b[0].output_ids == hf_greedy(hf, [21, 22], 10)
    assert_idle(engine)
