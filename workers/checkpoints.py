"""Keep a training job's checkpoints and its database rows in agreement across crashes.

A worker-run job writes, per version: the checkpoint (atomic rename), then the step's batches
and the version row in one transaction (`Repository.record_step`). So every version row has
its checkpoint, and after a crash `reconcile` finds either nothing newer than the database
(resume there) or a checkpoint whose step never committed (deleted; the step is redone).
Rejected batches stored after the latest version are deleted too: the resumed run redoes
those steps with the same seeds, so a retried step replaces them instead of adding copies.
"""

import shutil
from pathlib import Path

from core_engine.atomic_dir import recover
from core_engine.rl.checkpoint import checkpoint_dir, is_complete, list_checkpoints
from db import Repository


class ResumeError(RuntimeError):
    """The output directory does not match the job's recorded versions."""


def reconcile(repo: Repository, job_id: int, root: str | Path, fence: int) -> int | None:
    """Make ``root`` hold exactly the job's recorded versions, and the database hold nothing
    stored after the latest one (see the module docstring; the attempt's ``fence`` guards
    the deletion); returns the latest recorded version (None: a fresh job)."""
    root = Path(root)
    checkpoints = []
    if root.is_dir():
        recover(root, is_complete)
        checkpoints = list_checkpoints(root)
    latest = repo.latest_version(job_id)
    if latest is None:
        if checkpoints:
            raise ResumeError(
                f"{root} holds checkpoints of another run (version {checkpoints[0][0]}): "
                "use an empty output_dir"
            )
        return None
    repo.discard_unversioned(job_id, latest.version, fence)
    for version, path in checkpoints:
        if version > latest.version:
            shutil.rmtree(path)
    known = latest.version
    if known and not is_complete(checkpoint_dir(root, known)):
        raise ResumeError(f"the checkpoint of recorded version {known} is missing from {root}")
    return known
