"""The per-process engine cache keeps engines warm between evaluations of the same model,
within one memory budget for all of them."""

import pytest
import torch

from core_engine.cache.sizing import model_kv_bytes_per_token
from core_engine.engine import meta_model, weight_bytes
from core_engine.task import FinishReason, SamplingParams
from core_engine.toy import save_tiny_checkpoint
from workers.engines import EngineCache, EngineMemoryError


def test_engines_are_reused_per_checkpoint_and_version_and_evicted_lru(tiny_model):
    cache = EngineCache(capacity=2)
    first = cache.get(tiny_model, 0)
    assert first.version == 0 and first.tokenizer is not None
    assert cache.get(tiny_model, 0) is first
    assert cache.loads == 1

    other = cache.get(tiny_model, 5)  # the same files stamped as another version
    assert other is not first and other.version == 5
    cache.get(tiny_model, 0)  # 0 becomes the most recently used
    cache.get(tiny_model, 7)  # evicts 5
    assert cache.loads == 3
    assert cache.get(tiny_model, 0) is first
    cache.get(tiny_model, 5)
    assert cache.loads == 4


# --- one memory budget for all engines of a worker (issue 24, item 9) ----------------------


def request_bytes(checkpoint: str) -> int:
    """The KV of one request of the tiny model's whole context (the cache's engines take it)."""
    model = meta_model(checkpoint)
    return model_kv_bytes_per_token(model.config, torch.float32) * model.config.max_context


def footprint(engine) -> int:
    return weight_bytes(engine.model) + engine.kv_plan.kv_cache_bytes


def test_engines_share_the_worker_budget_and_the_oldest_makes_room(tiny_model):
    """Three engines, a budget that holds two: each pool is its share less its weights (not
    90% of free memory each), and the third evicts the least recently used."""
    weights, request = weight_bytes(meta_model(tiny_model)), request_bytes(tiny_model)
    share = weights + 4 * request
    cache = EngineCache(capacity=2, memory_bytes=2 * share)
    engines = [cache.get(tiny_model, v) for v in (0, 1, 2)]
    for engine in engines:
        assert weight_bytes(engine.model) == weights  # counted on the meta device, exactly
        assert engine.kv_plan.kv_cache_bytes == 4 * request and footprint(engine) <= share
    assert cache.used_bytes <= 2 * share and cache.loads == 3
    assert cache.get(tiny_model, 2) is engines[2] and cache.get(tiny_model, 1) is engines[1]
    cache.get(tiny_model, 0)
    assert cache.loads == 4  # 0 was evicted
    # the engine still serves after the eviction: four tokens, EOS ignored (a random tiny model
    # may sample it)
    [result] = engines[1].run_batch([[3, 4, 5]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 4


def test_an_engine_larger_than_its_share_runs_alone(tiny_model):
    weights, request = weight_bytes(meta_model(tiny_model)), request_bytes(tiny_model)
    budget = weights + 3 * request // 2  # half of it cannot hold the weights
    cache = EngineCache(capacity=2, memory_bytes=budget)
    first = cache.get(tiny_model, 0)
    assert footprint(first) <= budget and first.kv_plan.max_seq_len == 512
    second = cache.get(tiny_model, 1)  # room for one: 0 goes although capacity is 2
    assert cache.used_bytes == footprint(second) <= budget
    assert cache.get(tiny_model, 0) is not first and cache.loads == 3


def test_an_engine_that_cannot_fit_alone_is_refused_and_evicts_nothing(tiny_model, tmp_path):
    weights, request = weight_bytes(meta_model(tiny_model)), request_bytes(tiny_model)
    budget = weights + 2 * request
    big = str(save_tiny_checkpoint(tmp_path / "big", arch="llama", hidden_size=256))
    assert weight_bytes(meta_model(big)) > budget
    cache = EngineCache(capacity=2, memory_bytes=budget)
    small = cache.get(tiny_model, 0)
    with pytest.raises(EngineMemoryError, match=r"RLWB_ENGINE_MEMORY.*weights alone take"):
        cache.get(big, 0)
    assert cache.get(tiny_model, 0) is small and cache.loads == 1
    tight = EngineCache(capacity=1, memory_bytes=weights + request // 2)
    with pytest.raises(EngineMemoryError, match="less than one request"):
        tight.get(tiny_model, 0)
    assert tight.loads == 0


def test_an_adapters_engine_is_planned_with_its_adapter(tiny_model, tmp_path):
    """A LoRA version's engine: the base plus the adapter's tensors as saved (the LoRA
    matrices and a trained-whole LM head), on the meta device as once loaded."""
    from safetensors.torch import load_file

    from core_engine.adapters import add_adapter, save_adapter
    from core_engine.lora_settings import ADAPTER_FILE, LoraSettings
    from core_engine.model import load_model

    settings = LoraSettings(rank=8, modules_to_save=("lm_head",))
    save_adapter(add_adapter(load_model(tiny_model), settings), tmp_path / "adapter", tiny_model)
    saved = load_file(tmp_path / "adapter" / ADAPTER_FILE).values()
    planned = weight_bytes(meta_model(tmp_path / "adapter"))
    base = weight_bytes(meta_model(tiny_model))
    assert planned - base == sum(t.numel() * t.element_size() for t in saved)
    budget = planned + 4 * request_bytes(tiny_model)
    cache = EngineCache(capacity=1, memory_bytes=budget)
    engine = cache.get(str(tmp_path / "adapter"), 3)
    assert weight_bytes(engine.model) == planned and cache.used_bytes == footprint(engine) <= budget
