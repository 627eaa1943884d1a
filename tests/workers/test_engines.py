"""The per-process engine cache keeps engines warm between evaluations of the same model."""

from workers.engines import EngineCache


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
