"""Model choices: a local checkpoint directory, or the built-in demo policy (built on first use)."""

import fcntl

from core_engine.rl.demo_policy import build_demo_policy
from workers.settings import Settings
from workers.specs import DEMO_MODEL


def resolve_model(model: str, settings: Settings) -> str:
    """The checkpoint directory for ``model`` (`DEMO_MODEL` is built under the data dir)."""
    if model != DEMO_MODEL:
        return model
    path = settings.demo_policy_dir
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time, across workers
        return str(build_demo_policy(path))
