"""Directories written atomically: filled under a staging name, then renamed into place.

`atomic_dir(final, writer)` yields a fresh staging directory ``<final>.tmp`` (``<final>.tmp-TAG``
for a tagged writer) and, when the block ends without an error, replaces ``final`` with it.
The replacement runs inside ``writer.guard()``, which may refuse it (raise) and keeps it
exclusive: a worker's attempt passes a guard that checks, with the job row locked, that it
still owns the job (see `workers.training`). Staging directories are the only names this
module gives a ``.tmp`` ending; `recover` finishes or drops what an interrupted writer left.

`new_dir(final)` writes a directory where the user named one (an export): staged under a
fresh name of its own, never a path that exists, and renamed onto ``final`` only where that
is absent or an empty directory, so nothing the user owns is ever removed.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

_STAGING = re.compile(r"\.tmp(-[\w-]+)?$")


@dataclass(frozen=True)
class Writer:
    """Who writes: ``tag`` keeps its staging directories apart from other writers', and
    ``guard()`` surrounds each commit (raise in it to refuse the commit)."""

    tag: str = ""
    guard: Callable[[], AbstractContextManager[object]] = field(default=nullcontext)


def staging_dir(final: Path, tag: str = "") -> Path:
    """Where a write of ``final`` is staged."""
    return final.with_name(f"{final.name}.tmp" + (f"-{tag}" if tag else ""))


def is_staging(path: Path) -> bool:
    """Whether ``path`` is a staging directory (never a finished one)."""
    return _STAGING.search(path.name) is not None


@contextmanager
def atomic_dir(final: str | Path, writer: Writer | None = None) -> Iterator[Path]:
    """Fill the yielded directory; it becomes ``final`` (replacing it) when the block ends
    without an error and ``writer.guard()`` lets it; otherwise it is removed."""
    final, writer = Path(final), writer or Writer()
    staging = staging_dir(final, writer.tag)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        with writer.guard():
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def new_dir(final: str | Path) -> Iterator[Path]:
    """Fill the yielded directory (``.<name>.<random>.tmp`` beside ``final``, created here);
    it becomes ``final`` when the block ends without an error. `OSError` when ``final`` is
    then neither absent nor an empty directory; the staging directory is removed on failure."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    staging.mkdir()  # exclusive: never a directory that was there
    try:
        yield staging
        staging.rename(final)  # onto an absent or empty directory only
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def recover(root: Path, complete: Callable[[Path], bool]) -> None:
    """Staging directories under ``root`` left by an interrupted writer: a ``complete`` one
    whose final directory is gone was interrupted between the removal of the old directory
    and the rename, so it is renamed into place; any other is dropped."""
    for staging in sorted(p for p in root.iterdir() if is_staging(p)):
        final = staging.with_name(_STAGING.sub("", staging.name))
        if not final.exists() and complete(staging):
            staging.rename(final)
        else:
            shutil.rmtree(staging)
