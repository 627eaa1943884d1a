"""A small per-process cache of warm engines (model + KV pool), keyed by checkpoint and
version, so evaluations of the same model do not reload it."""

import threading
from collections import OrderedDict
from pathlib import Path

from core_engine.engine import load_engine
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
        """An engine serving ``checkpoint`` stamped as policy ``version``."""
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
        config = EngineConfig(max_batch_size=MAX_BATCH_SIZE)
        return load_engine(path, config, device=self.device, policy_version=version)


_cache: EngineCache | None = None


def engine_cache(capacity: int, device: str) -> EngineCache:
    """This process's cache (created on first use, in the worker, never before a fork)."""
    global _cache
    if _cache is None:
        _cache = EngineCache(capacity, device)
    return _cache
