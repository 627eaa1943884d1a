"""Engines of saved policies: which checkpoint a job names (a directory, or the built-in demo
policy, built on first use), a small per-process cache of warm engines (model + KV pool) keyed
by checkpoint and version, and the check of a loaded engine against its recorded checksum."""

import fcntl
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from core_engine.engine import load_engine
from core_engine.rl.demo_policy import build_demo_policy
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.weights import model_checksum
from db import PolicyVersionInfo, Repository, VersionNotFound
from workers.settings import Settings
from workers.specs import DEMO_MODEL

MAX_BATCH_SIZE = 64


class WeightsNotKept(ValueError):
    """A recorded version whose checkpoint was not retained."""


class ChecksumMismatch(ValueError):
    """A checkpoint whose weights are not the ones recorded for its version."""


def resolve_model(model: str, settings: Settings, log: Callable[[str], None] | None = None) -> str:
    """The checkpoint directory for ``model`` (`DEMO_MODEL` is built under the data dir, with
    the warm-up's progress lines going to ``log``)."""
    if model != DEMO_MODEL:
        return model
    path = settings.demo_policy_dir
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time, across workers
        return str(build_demo_policy(path, log=log))


def demo_is_built(settings: Settings) -> bool:
    """Whether the demo policy is already on disk (no warm-up needed)."""
    return (settings.demo_policy_dir / "config.json").is_file()


def saved_version(repo: Repository, job_id: int, version: int) -> PolicyVersionInfo:
    """The version's record (`VersionNotFound`), if its weights are still on disk
    (`WeightsNotKept`)."""
    info = repo.get_version(job_id, version)
    if info is None:
        raise VersionNotFound(job_id, version)
    if info.checkpoint_path is None or not Path(info.checkpoint_path).is_dir():
        raise WeightsNotKept(f"job {job_id} version {version}: weights not kept")
    return info


def _key(checkpoint: str, version: int) -> tuple[str, int]:
    return str(Path(checkpoint).resolve()), version


class EngineCache:
    """At most ``capacity`` engines, least recently used evicted first, each with the
    checksum of its weights (computed once, on first use)."""

    def __init__(self, capacity: int, device: str = "cpu") -> None:
        self.capacity = max(1, capacity)
        self.device = device
        self._engines: OrderedDict[tuple[str, int], InferenceScheduler] = OrderedDict()
        self._checksums: dict[tuple[str, int], str] = {}  # of the cached engines
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, checkpoint: str, version: int) -> InferenceScheduler:
        """An engine serving ``checkpoint`` stamped as policy ``version``."""
        key = _key(checkpoint, version)
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._load(key[0], version)
            self._engines[key] = engine
            while len(self._engines) > self.capacity:
                self._checksums.pop(self._engines.popitem(last=False)[0], None)
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

    def _load(self, path: str, version: int) -> InferenceScheduler:
        self.loads += 1
        config = EngineConfig(max_batch_size=MAX_BATCH_SIZE)
        return load_engine(path, config, device=self.device, policy_version=version)


_cache: EngineCache | None = None


def engine_cache(settings: Settings) -> EngineCache:
    """This process's cache (created on first use, in the worker, never before a fork)."""
    global _cache
    if _cache is None:
        _cache = EngineCache(settings.engine_cache_size, settings.device)
    return _cache
