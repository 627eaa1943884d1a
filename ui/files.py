"""Where checkpoints and prompt sets live: the configured roots, discovery and uploads.
Discovery lists names and ``stat``s them, opening nothing: a checkpoint's ``config.json`` and a
prompt set must be regular files of bounded size (`workers.api.regular_file`) to be offered.
"""

import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from workers.api import (
    MAX_DATA_BYTES,
    MAX_TEXT_BYTES,
    UPLOADS_DIR,
    UnsafeFileError,
    is_under,
    regular_file,
    size_text,
)

__all__ = [
    "UploadRefused",
    "find_checkpoints",
    "find_data_files",
    "find_jsonl",
    "is_under",
    "save_upload",
]

MAX_DEPTH = 3
MAX_FOUND = 200
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # `core_engine.rl.data.files`
MIB = 2**20
# What the stored uploads may take together (``RLWB_UPLOAD_QUOTA_MB``, default 256 MiB).
UPLOAD_QUOTA_BYTES = int(os.environ.get("RLWB_UPLOAD_QUOTA_MB") or 256) * MIB
_STORING = threading.Lock()  # the quota is checked and the copy made by one upload at a time


class UploadRefused(ValueError):
    """An upload that would take the stored uploads over their quota."""


def _walk(roots: Sequence[Path]) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` over each root, at most `MAX_DEPTH` levels deep, skipping hidden folders."""
    for root in roots:
        root = root.resolve()
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            depth = len(here.relative_to(root).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < MAX_DEPTH)
            yield here, dirs, files


def _is_regular(path: Path, max_bytes: int) -> bool:
    try:
        regular_file(path, max_bytes)
    except UnsafeFileError:
        return False
    return True


def find_checkpoints(roots: Sequence[Path]) -> list[Path]:
    """Hugging Face checkpoint directories (``config.json`` + safetensors) under ``roots``."""
    found = []
    for folder, _, files in _walk(roots):
        if (
            "config.json" in files
            and any(name.endswith(".safetensors") for name in files)
            and _is_regular(folder / "config.json", MAX_TEXT_BYTES)
        ):
            found.append(folder)
            if len(found) >= MAX_FOUND:
                break
    return found


def find_jsonl(roots: Sequence[Path]) -> list[Path]:
    """``*.jsonl`` prompt sets under ``roots`` (regular files of at most `MAX_DATA_BYTES`)."""
    return find_data_files(roots, (".jsonl",))


def find_data_files(roots: Sequence[Path], suffixes: tuple[str, ...] = DATA_SUFFIXES) -> list[Path]:
    """Prompt sets under ``roots`` (regular files of at most `MAX_DATA_BYTES`) named with one
    of ``suffixes``; ``.json`` files beside a ``config.json`` (a checkpoint's) are not data."""
    found = []
    for folder, _, files in _walk(roots):
        checkpoint = "config.json" in files
        names = (
            name
            for name in sorted(files)
            if name.endswith(suffixes) and not (checkpoint and name.endswith(".json"))
        )
        found.extend(p for p in (folder / n for n in names) if _is_regular(p, MAX_DATA_BYTES))
        if len(found) >= MAX_FOUND:
            return found[:MAX_FOUND]
    return found


def stored_bytes(folder: Path) -> int:
    """The bytes the regular files directly in ``folder`` take (0 if it does not exist)."""
    if not folder.is_dir():
        return 0
    with os.scandir(folder) as entries:
        return sum(
            e.stat(follow_symlinks=False).st_size
            for e in entries
            if e.is_file(follow_symlinks=False)
        )


def save_upload(source: str | Path, data_dir: Path, quota: int | None = None) -> Path:
    """Copy an uploaded file (a regular one: `UnsafeFileError` else) into
    ``<data_dir>/datasets/``, never overwriting; `UploadRefused` when the stored uploads
    would then take more than ``quota`` bytes (default `UPLOAD_QUOTA_BYTES`)."""
    source = Path(source)
    quota = UPLOAD_QUOTA_BYTES if quota is None else quota
    size = regular_file(source, quota).st_size
    target_dir = data_dir / UPLOADS_DIR
    with _STORING:
        used = stored_bytes(target_dir)
        if used + size > quota:
            raise UploadRefused(
                f"the stored uploads would take {size_text(used + size)}, over their "
                f"{size_text(quota)} quota (RLWB_UPLOAD_QUOTA_MB): remove prompt sets "
                f"from the data directory's {UPLOADS_DIR}/ folder first"
            )
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / source.name
        stem, number = target.stem, 1
        while target.exists():
            target = target_dir / f"{stem}-{number}{target.suffix}"
            number += 1
        shutil.copyfile(source, target)
    return target
