"""KV pool sizing: a byte budget and the job's lengths, never "batch x full context"."""

import pytest
import torch
import transformers

from core_engine.cache.sizing import (
    DEFAULT_CPU_KV_BYTES,
    EngineSizingError,
    engines_memory_budget,
    kv_budget_bytes,
    kv_bytes_per_token,
    model_kv_bytes_per_token,
    plan_kv,
)
from core_engine.config import EngineConfig, plan_for
from core_engine.model import build_model
from core_engine.scheduler import InferenceScheduler
from core_engine.task import FinishReason, SamplingParams
from core_engine.toy import tiny_config

from .reference import assert_idle, hf_greedy


def qwen05_shape() -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
    )


def test_bytes_per_token_by_hand():
    # Qwen2.5-0.5B: 24 layers x 2 KV heads x 64 dims x (K and V) x 4 bytes.
    assert model_kv_bytes_per_token(qwen05_shape(), torch.float32) == 24 * 2 * 64 * 2 * 4
    assert model_kv_bytes_per_token(qwen05_shape(), torch.bfloat16) == 24 * 2 * 64 * 2 * 2
    assert kv_bytes_per_token(28, 4, 128, torch.bfloat16) == 57344  # a 7B Qwen shape


def test_default_cpu_pool_is_the_budget_not_batch_times_context():
    """The issue's case: 128 request slots of Qwen2.5-0.5B's 32k context would be ~48 GiB."""
    per_token = model_kv_bytes_per_token(qwen05_shape(), torch.float32)
    budget = kv_budget_bytes(None, 0.9, torch.device("cpu"))
    plan = plan_kv(
        strategy="paged",
        max_batch_size=128,
        max_seq_len=32768,
        page_size=16,
        bytes_per_token=per_token,
        budget_bytes=budget,
    )
    assert budget == DEFAULT_CPU_KV_BYTES
    assert plan.kv_cache_bytes <= DEFAULT_CPU_KV_BYTES < 128 * 32768 * per_token
    assert plan.num_pages == DEFAULT_CPU_KV_BYTES // (16 * per_token)


def test_cuda_budget_is_a_fraction_of_free_memory_after_weights():
    gib = 1 << 30

    def fake_mem_get_info(device):
        assert device.type == "cuda"
        return 10 * gib, 80 * gib  # free, total

    budget = kv_budget_bytes(None, 0.5, torch.device("cuda", 0), fake_mem_get_info)
    assert budget == 5 * gib
    assert kv_budget_bytes(123_456, 0.5, torch.device("cuda", 0), fake_mem_get_info) == 123_456
    with pytest.raises(EngineSizingError, match="gpu_memory_utilization"):
        kv_budget_bytes(None, 1.5, torch.device("cuda", 0), fake_mem_get_info)


def test_the_engines_of_a_worker_share_one_budget():
    """Issue 24, item 9: one budget for all warm engines (`workers.engines.EngineCache`
    splits it), not 90% of the free device memory for each of them."""
    gib = 1 << 30

    def fake_mem_get_info(device):
        assert device.type == "cuda"
        return 70 * gib, 80 * gib  # free, total

    cuda = torch.device("cuda", 0)
    assert engines_memory_budget(None, cuda, fake_mem_get_info) == int(0.9 * 70 * gib)
    assert engines_memory_budget(24 * gib, cuda, fake_mem_get_info) == 24 * gib
    assert engines_memory_budget(None, torch.device("cpu")) is None  # CPU: as before
    assert engines_memory_budget(gib, torch.device("cpu")) == gib
    with pytest.raises(EngineSizingError, match="engine memory"):
        engines_memory_budget(0, torch.device("cpu"))


def test_job_lengths_bound_the_pool():
    plan = plan_kv(
        strategy="paged",
        max_batch_size=4,
        max_seq_len=100,
        page_size=16,
        bytes_per_token=1000,
        budget_bytes=10**9,
    )
    assert plan.num_pages == 4 * 7  # never more than 4 requests of 100 tokens need
    assert plan.kv_cache_bytes == 4 * 7 * 16 * 1000


def test_budget_below_one_request_is_a_clear_error_at_construction():
    model = build_model(tiny_config("qwen2", max_position_embeddings=512))
    per_token = model_kv_bytes_per_token(model.config, torch.float32)
    config = EngineConfig(max_seq_len=256, kv_cache_bytes=100 * per_token)
    with pytest.raises(EngineSizingError) as info:
        InferenceScheduler(model, config)
    message = str(info.value)
    assert "max_seq_len=256" in message and str(100 * per_token) in message
    assert str(256 * per_token) in message  # what would be enough
    contiguous = EngineConfig(
        max_seq_len=256, kv_cache_bytes=100 * per_token, kv_strategy="contiguous"
    )
    with pytest.raises(EngineSizingError):
        InferenceScheduler(model, contiguous)


def test_contiguous_pool_fits_the_budget_with_fewer_request_slots(qwen2_pair):
    ours, hf = qwen2_pair
    per_token = model_kv_bytes_per_token(ours.config, torch.float32)
    config = EngineConfig(
        max_batch_size=8,
        max_seq_len=32,
        kv_strategy="contiguous",
        kv_cache_bytes=3 * 32 * per_token,
    )
    engine = InferenceScheduler(ours, config)
    assert engine.stats()["max_batch_size"] == 3
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = [[i + 1, i + 2] for i in range(7)]  # more requests than slots: waves
    results = engine.run_batch(prompts, params)
    assert [r.output_ids for r in results] == [hf_greedy(hf, p, 4) for p in prompts]
    assert_idle(engine)


def test_stats_report_the_chosen_sizes_and_explicit_pages_still_work(qwen2_pair):
    ours, _ = qwen2_pair
    per_token = model_kv_bytes_per_token(ours.config, torch.float32)
    engine = InferenceScheduler(
        ours, EngineConfig(max_seq_len=64, page_size=8, kv_cache_bytes=40 * 8 * per_token)
    )
    stats = engine.stats()
    assert (stats["num_pages"], stats["page_size"], stats["max_seq_len"]) == (40, 8, 64)
    assert stats["kv_cache_bytes"] == 40 * 8 * per_token
    assert engine.pool.buffer.nbytes == (40 * 8 + 1) * per_token  # + the scratch slot
    assert stats["kv_bytes_per_token"] == per_token
    explicit = InferenceScheduler(ours, EngineConfig(page_size=4, num_pages=3))
    assert explicit.stats()["num_pages"] == 3
    result = explicit.run_batch([[1, 2]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert result.finish_reason == FinishReason.LENGTH


def test_plan_for_caps_max_seq_len_at_the_model_context(qwen2_pair):
    ours, _ = qwen2_pair
    plan = plan_for(ours, EngineConfig(max_seq_len=10**6, kv_cache_bytes=1 << 26))
    assert plan.max_seq_len == ours.config.max_context
