"""Files a user names (a checkpoint directory, a prompt set, an upload, a job file): used only
when they are regular files, or a directory of them, of bounded size, checked with ``lstat``
before anything is opened. A FIFO would block its reader forever and a sparse file claims any
size for free: both are refused without being read. Links are resolved first, and the target
must lie inside the allowed roots. No torch, no project imports.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

MIB = 2**20
GIB = 2**30
MAX_TEXT_BYTES = 64 * MIB  # a file a loader parses whole: config.json, tokenizer.json (Qwen: 7 MiB)
MAX_DATA_BYTES = 256 * MIB  # a prompt set: a data file or a saved dataset directory
MAX_WEIGHT_FILE_BYTES = 64 * GIB  # any other file of a checkpoint (a 7B fp32 model in one: 28 GiB)
MAX_CHECKPOINT_ENTRIES = 10_000  # files and folders directly in a checkpoint directory
WEIGHTS_FILE = "model.safetensors"  # a full-weight checkpoint's weights (`core_engine.weights`)
# The files of a checkpoint directory that `transformers` and the model loader parse whole.
PARSED_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "chat_template.jinja",
        "chat_template.json",
        "model.safetensors.index.json",
        "adapter_config.json",
    }
)
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


class UnsafeFileError(ValueError):
    """A named file that is not read: missing, outside the roots, not regular, or too large."""


def is_under(path: str | Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` (resolved, links followed) lies inside one of ``roots``."""
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def _lstat(path: Path, shown: str | Path) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise UnsafeFileError(f"{shown} does not exist") from None
    except OSError as exc:
        raise UnsafeFileError(f"{shown} cannot be read: {exc.strerror}") from None


def _check_regular(info: os.stat_result, max_bytes: int, shown: str | Path) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a special file")
        raise UnsafeFileError(f"{shown} is {kind}, not a regular file")
    if info.st_size > max_bytes:
        raise UnsafeFileError(
            f"{shown} is {size_text(info.st_size)}, over the {size_text(max_bytes)} limit"
        )


def size_text(count: int) -> str:
    """A size in words: bytes below 1 MiB, else MiB."""
    return f"{count / MIB:,.1f} MiB" if count >= MIB else f"{count:,} bytes"


def regular_file(
    path: str | Path, max_bytes: int, roots: Sequence[Path] | None = None
) -> os.stat_result:
    """The ``stat`` of ``path``, a regular file of at most ``max_bytes`` (inside ``roots`` when
    given, links resolved), or `UnsafeFileError`. Nothing is opened."""
    resolved = Path(path).resolve()
    if roots is not None and not is_under(resolved, roots):
        raise UnsafeFileError(f"{path} is outside the allowed folders")
    info = _lstat(resolved, path)
    _check_regular(info, max_bytes, path)
    return info


def open_regular(path: str | Path, max_bytes: int, roots: Sequence[Path] | None = None) -> BinaryIO:
    """``path`` opened for binary reading once `regular_file` allows it; checked again on the
    open descriptor, so a file swapped for a FIFO or a larger one in between is refused too."""
    regular_file(path, max_bytes, roots)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(Path(path).resolve(), flags)
    except OSError as exc:
        raise UnsafeFileError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        _check_regular(os.fstat(fd), max_bytes, path)
    except UnsafeFileError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_text(path: str | Path, max_bytes: int, roots: Sequence[Path] | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` (see `open_regular`)."""
    with open_regular(path, max_bytes, roots) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFileError(f"{path} grew over the {size_text(max_bytes)} limit")
    return data.decode("utf-8")


def checkpoint_dir(path: str | Path, roots: Sequence[Path] | None = None) -> Path:
    """The resolved checkpoint directory ``path``: a directory (inside ``roots`` when given)
    with a ``config.json``, whose entries are folders (not read) or regular files, each link
    resolved inside ``roots``; the files loaders parse whole (`PARSED_FILES`) are at most
    `MAX_TEXT_BYTES`, others `MAX_WEIGHT_FILE_BYTES`. `UnsafeFileError` otherwise."""
    resolved = Path(path).resolve()
    if roots is not None and not is_under(resolved, roots):
        raise UnsafeFileError(f"{path} is outside the allowed folders")
    if not stat.S_ISDIR(_lstat(resolved, path).st_mode):
        raise UnsafeFileError(f"{path} is not a directory")
    if not (resolved / "config.json").exists():
        raise UnsafeFileError(f"{path} has no config.json")
    with os.scandir(resolved) as entries:
        for number, entry in enumerate(entries, start=1):
            if number > MAX_CHECKPOINT_ENTRIES:
                raise UnsafeFileError(f"{path} has over {MAX_CHECKPOINT_ENTRIES:,} entries")
            if entry.is_dir(follow_symlinks=False):
                continue
            limit = MAX_TEXT_BYTES if entry.name in PARSED_FILES else MAX_WEIGHT_FILE_BYTES
            regular_file(Path(path) / entry.name, limit, roots)
    return resolved


def dataset_dir(path: str | Path, max_bytes: int, roots: Sequence[Path] | None = None) -> Path:
    """The resolved directory ``path`` of a saved dataset (`datasets` ``save_to_disk``): inside
    ``roots`` when given, entries regular files (or folders of them, one level, for a split per
    folder) of at most ``max_bytes`` together, or `UnsafeFileError`."""
    resolved = Path(path).resolve()
    if roots is not None and not is_under(resolved, roots):
        raise UnsafeFileError(f"{path} is outside the allowed folders")
    if not stat.S_ISDIR(_lstat(resolved, path).st_mode):
        raise UnsafeFileError(f"{path} is not a directory")
    total, count = 0, 0
    for folder in (resolved, *(p for p in resolved.iterdir() if p.is_dir() and not p.is_symlink())):
        for entry in folder.iterdir():
            count += 1
            if count > MAX_CHECKPOINT_ENTRIES:
                raise UnsafeFileError(f"{path} has over {MAX_CHECKPOINT_ENTRIES:,} entries")
            if folder == resolved and entry.is_dir() and not entry.is_symlink():
                continue
            total += regular_file(entry, max_bytes, roots or (resolved,)).st_size
    if total > max_bytes:
        raise UnsafeFileError(
            f"{path} holds {size_text(total)}, over the {size_text(max_bytes)} limit"
        )
    return resolved
