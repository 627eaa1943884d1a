"""What of a policy version is still on disk: whether its weights are (what the audit, the
Playground and ``export`` need, and what the Samples list marks) and a LoRA version's adapter
size. Imports no torch."""

from pathlib import Path

from core_engine.lora_settings import ADAPTER_FILE
from core_engine.user_files import WEIGHTS_FILE
from db import PolicyVersionInfo


def weights_kept(info: PolicyVersionInfo) -> bool:
    """Whether the version's checkpoint directory still holds its weights file (full weights or
    a LoRA adapter): retention deletes old versions
    (`core_engine.rl.trainer.checkpoint.prune_checkpoints`), and a directory may be left
    without them."""
    if info.checkpoint_path is None:
        return False
    directory = Path(info.checkpoint_path)
    return any((directory / name).is_file() for name in (WEIGHTS_FILE, ADAPTER_FILE))


def adapter_bytes(checkpoint: str | None) -> int | None:
    """The size of a LoRA version's adapter (its ``adapter_model.safetensors``); None when
    the checkpoint holds none (a full-weight version, or weights not kept)."""
    try:
        return (Path(checkpoint) / ADAPTER_FILE).stat().st_size if checkpoint else None
    except OSError:
        return None
