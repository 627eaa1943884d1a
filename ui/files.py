"""Where checkpoints and prompt sets live: the configured roots, discovery and uploads."""

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from workers.api import is_under

__all__ = ["find_checkpoints", "find_jsonl", "is_under", "save_upload"]

MAX_DEPTH = 3
MAX_FOUND = 200
UPLOADS_DIR = "datasets"


def _walk(roots: Sequence[Path]) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` over each root, at most `MAX_DEPTH` levels deep, skipping hidden folders."""
    for root in roots:
        root = root.resolve()
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            depth = len(here.relative_to(root).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < MAX_DEPTH)
            yield here, dirs, files


def find_checkpoints(roots: Sequence[Path]) -> list[Path]:
    """Hugging Face checkpoint directories (``config.json`` + safetensors) under ``roots``."""
    found = []
    for folder, _, files in _walk(roots):
        if "config.json" in files and any(name.endswith(".safetensors") for name in files):
            found.append(folder)
            if len(found) >= MAX_FOUND:
                break
    return found


def find_jsonl(roots: Sequence[Path]) -> list[Path]:
    """``*.jsonl`` prompt sets under ``roots``."""
    found = []
    for folder, _, files in _walk(roots):
        found.extend(folder / name for name in sorted(files) if name.endswith(".jsonl"))
        if len(found) >= MAX_FOUND:
            return found[:MAX_FOUND]
    return found


def save_upload(source: str | Path, data_dir: Path) -> Path:
    """Copy an uploaded JSONL file into ``<data_dir>/datasets/`` (never overwriting)."""
    source = Path(source)
    target_dir = data_dir / UPLOADS_DIR
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / source.name
    stem, number = target.stem, 1
    while target.exists():
        target = target_dir / f"{stem}-{number}{target.suffix}"
        number += 1
    shutil.copyfile(source, target)
    return target
