"""Model choices: a local checkpoint directory, or the built-in demo policy (built on first use)."""

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

from workers.settings import Settings
from workers.specs import DEMO_MODEL


def resolve_model(model: str, settings: Settings, log: Callable[[str], None] | None = None) -> str:
    """The checkpoint directory for ``model`` (`DEMO_MODEL` is built under the data dir, with
    the warm-up's progress lines going to ``log``)."""
    if model != DEMO_MODEL:
        return model
    path = settings.demo_policy_dir
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time, across workers
        return str(_build_demo(path, log))


def demo_is_built(settings: Settings) -> bool:
    """Whether the demo policy is already on disk (no warm-up needed)."""
    return (settings.demo_policy_dir / "config.json").is_file()


def _build_demo(path: Path, log: Callable[[str], None] | None) -> Path:
    """The addition demo policy if `core_engine.rl.demo_policy` exists, else a tiny random
    checkpoint (a model that runs, but learns nothing in a demo)."""
    try:
        from core_engine.rl.demo_policy import build_demo_policy
    except ImportError:
        return _tiny_random(path)
    return Path(build_demo_policy(path, log=log))


def _tiny_random(path: Path) -> Path:
    from core_engine.toy import save_tiny_checkpoint

    if not (path / "config.json").is_file():
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_tiny_checkpoint(tmp, arch="llama")
        tmp.rename(path)
    return path
