"""Engines of saved policies: a small per-process cache of warm engines (model + KV pool)
keyed by checkpoint and version and sharing one memory budget, and the check of a loaded
engine against its recorded checksum (which checkpoint a job names: `workers.job_files`)."""

import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from core_engine.cache.sizing import EngineSizingError, engines_memory_budget
from core_engine.config import plan_for
from core_engine.engine import load_engine, meta_model, resolve_device, weight_bytes
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.weights import model_checksum
from db import PolicyVersionInfo, Repository, VersionNotFound
from workers.kept_weights import weights_kept
from workers.settings import Settings

MAX_BATCH_SIZE = 64


class WeightsNotKept(ValueError):
    """A recorded version whose checkpoint was not retained."""


class ChecksumMismatch(ValueError):
    """A checkpoint whose weights are not the ones recorded for its version."""


class EngineMemoryError(ValueError):
    """An engine that cannot run in the worker's engine memory, even alone."""


def saved_version(repo: Repository, job_id: int, version: int) -> PolicyVersionInfo:
    """The version's record (`VersionNotFound`), if its weights are still on disk
    (`WeightsNotKept`)."""
    info = repo.get_version(job_id, version)
    if info is None:
        raise VersionNotFound(job_id, version)
    if not weights_kept(info):
        raise WeightsNotKept(f"job {job_id} version {version}: weights not kept")
    return info


def _key(checkpoint: str, version: int) -> tuple[str, int]:
    return str(Path(checkpoint).resolve()), version


class EngineCache:
    """At most ``capacity`` engines, least recently used evicted first, each with the
    checksum of its weights (computed once, on first use).

    With ``memory_bytes``, the engines share that budget, weights and KV pools together: a
    new engine's KV pool gets its equal share (``memory_bytes / capacity``) less its weights
    or, where that cannot hold one request, the whole budget less its weights; the least
    recently used engines are evicted until it fits, before it loads (an evicted engine still
    serving a request frees its memory when that request ends). None: no shared budget, each
    pool is the engine's default (`core_engine.cache.sizing`)."""

    def __init__(self, capacity: int, device: str = "cpu", memory_bytes: int | None = None) -> None:
        self.capacity = max(1, capacity)
        self.device = device
        self.memory_bytes = memory_bytes
        self._engines: OrderedDict[tuple[str, int], InferenceScheduler] = OrderedDict()
        self._checksums: dict[tuple[str, int], str] = {}  # of the cached engines
        self._bytes: dict[tuple[str, int], int] = {}  # weights + KV pool of the cached engines
        self._lock = threading.Lock()
        self.loads = 0

    @property
    def used_bytes(self) -> int:
        """What the cached engines take: weights and KV pools."""
        return sum(self._bytes.values())

    def get(self, checkpoint: str, version: int) -> InferenceScheduler:
        """An engine serving ``checkpoint`` stamped as policy ``version``."""
        key = _key(checkpoint, version)
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._load(key, version)
            self._engines[key] = engine
            while len(self._engines) > self.capacity:
                self._evict_oldest()
            return engine

    def verified(
        self, checkpoint: str, version: int, expected: str | None
    ) -> tuple[InferenceScheduler, str]:
        """`get`, and the checksum of the engine's weights, which must be ``expected`` when
        one is recorded (`ChecksumMismatch`)."""
        engine, key = self.get(checkpoint, version), _key(checkpoint, version)
        with self._lock:
            if key not in self._checksums:
                self._checksums[key] = model_checksum(engine.model)
            checksum = self._checksums[key]
        if expected is not None and checksum != expected:
            raise ChecksumMismatch(
                f"the checkpoint of version {version} ({checkpoint}) does not match "
                "its recorded checksum"
            )
        return engine, checksum

    def _load(self, key: tuple[str, int], version: int) -> InferenceScheduler:
        config = EngineConfig(max_batch_size=MAX_BATCH_SIZE)
        if self.memory_bytes is not None:
            config = self._make_room(key[0], config, self.memory_bytes)
        self.loads += 1
        engine = load_engine(key[0], config, device=self.device, policy_version=version)
        self._bytes[key] = weight_bytes(engine.model) + engine.kv_plan.kv_cache_bytes
        return engine

    def _make_room(self, path: str, config: EngineConfig, budget: int) -> EngineConfig:
        """``config`` with the KV budget of a new engine of ``path`` (see the class), once
        the engines it needs the room of are evicted; planned on the meta device, before
        anything loads. `EngineMemoryError`, evicting nothing, when it cannot fit alone."""
        model = meta_model(path, device=self.device)
        weights = weight_bytes(model)
        problem = f"its weights alone take {weights:,} bytes"
        for kv_bytes in (budget // self.capacity - weights, budget - weights):
            if kv_bytes <= 0:
                continue
            try:
                plan = plan_for(model, replace(config, kv_cache_bytes=kv_bytes))
                break
            except EngineSizingError as exc:
                problem = f"beside its {weights:,} bytes of weights, {exc}"
        else:
            raise EngineMemoryError(
                f"{path} cannot run in this worker's engine memory ({budget:,} bytes, "
                f"RLWB_ENGINE_MEMORY): {problem}"
            )
        while self._engines and self.used_bytes + weights + plan.kv_cache_bytes > budget:
            self._evict_oldest()
        return replace(config, kv_cache_bytes=plan.kv_cache_bytes)

    def _evict_oldest(self) -> None:
        key, _engine = self._engines.popitem(last=False)
        self._checksums.pop(key, None)
        self._bytes.pop(key, None)


_cache: EngineCache | None = None


def engine_cache(settings: Settings) -> EngineCache:
    """This process's cache (created on first use, in the worker, never before a fork)."""
    global _cache
    if _cache is None:
        device = resolve_device(settings.device)
        budget = engines_memory_budget(settings.engine_memory_bytes, device)
        _cache = EngineCache(settings.engine_cache_size, settings.device, budget)
    return _cache
