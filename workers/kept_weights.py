"""Whether a policy version's weights are still on disk: what the audit, the Playground and
``export`` need, and what the Samples list marks. Imports no torch."""

from pathlib import Path

from db import PolicyVersionInfo


def weights_kept(info: PolicyVersionInfo) -> bool:
    """Whether the version's checkpoint directory is still on disk (retention deletes old
    ones, `core_engine.rl.trainer.checkpoint.prune_checkpoints`)."""
    return info.checkpoint_path is not None and Path(info.checkpoint_path).is_dir()
