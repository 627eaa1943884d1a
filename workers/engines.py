"""A small per-process cache of warm engines (model + KV pool), keyed by checkpoint and
version, so evaluations of the same model do not reload it."""

import threading
from collections import OrderedDict
from pathlib import Path

import torch
from transformers import AutoTokenizer

from core_engine.model import checkpoint_eos_ids, load_model
from core_engine.scheduler import EngineConfig, InferenceScheduler

MAX_BATCH_SIZE = 64


class EngineCache:
    """At most ``capacity`` engines, least recently used evicted first."""

    def __init__(self, capacity: int, device: str = "cpu") -> None:
        self.capacity = max(1, capacity)
        self.device = device
        self._engines: OrderedDict[tuple[str, int], InferenceScheduler] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, checkpoint: str, version: int) -> InferenceScheduler:
        """An engine serving ``checkpoint`` stamped as policy ``version`` (fp32)."""
        key = (str(Path(checkpoint).resolve()), version)
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._load(key[0], version)
            self._engines[key] = engine
            while len(self._engines) > self.capacity:
                self._engines.popitem(last=False)
            return engine

    def _load(self, path: str, version: int) -> InferenceScheduler:
        self.loads += 1
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        eos = set(checkpoint_eos_ids(path))
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        config = EngineConfig(max_batch_size=MAX_BATCH_SIZE, eos_token_ids=tuple(sorted(eos)))
        model = load_model(path, torch.float32, self.device)
        return InferenceScheduler(model, config, tokenizer, policy_version=version)


_cache: EngineCache | None = None


def engine_cache(capacity: int, device: str) -> EngineCache:
    """This process's cache (created on first use, in the worker, never before a fork)."""
    global _cache
    if _cache is None:
        _cache = EngineCache(capacity, device)
    return _cache
