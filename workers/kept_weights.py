"""What of a policy version is still on disk: whether its weights are (what the audit, the
Playground and ``export`` need, and what the Samples list marks) and a LoRA version's adapter
size. Imports no torch."""

from pathlib import Path

from core_engine.lora_settings import ADAPTER_FILE
from db import PolicyVersionInfo


def weights_kept(info: PolicyVersionInfo) -> bool:
    """Whether the version's checkpoint directory is still on disk (retention deletes old
    ones, `core_engine.rl.trainer.checkpoint.prune_checkpoints`)."""
    return info.checkpoint_path is not None and Path(info.checkpoint_path).is_dir()


def adapter_bytes(checkpoint: str | None) -> int | None:
    """The size of a LoRA version's adapter (its ``adapter_model.safetensors``); None when
    the checkpoint holds none (a full-weight version, or weights not kept)."""
    try:
        return (Path(checkpoint) / ADAPTER_FILE).stat().st_size if checkpoint else None
    except OSError:
        return None
