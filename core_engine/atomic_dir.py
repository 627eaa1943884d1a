"""Directories written atomically: filled under a staging name, then renamed into place.

`atomic_dir(final, writer)` yields a fresh staging directory ``<final>.tmp`` (``<final>.tmp-TAG``
for a tagged writer) and, when the block ends without an error, replaces ``final`` with it.
The replacement runs inside ``writer.guard()``, which may refuse it (raise) and keeps it
exclusive: a worker's attempt passes a guard that checks, with the job row locked, that it
still owns the job (see `workers.training`). Staging directories are the only names this
module gives a ``.tmp`` ending; `recover` finishes or drops what an interrupted writer left.
"""

from __future__ import annotations

import re
import shutil
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
