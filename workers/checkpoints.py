"""Keep a training job's checkpoints and its database rows in agreement across crashes.

A worker-run job writes, per version: the checkpoint (atomic rename), a note beside it with
the version's record, the accepted batch, then the version row. So every version row has its
checkpoint, and after a crash `reconcile` finds one of: nothing newer than the database (resume
there); a checkpoint whose batch never committed (deleted, the step is redone); or a checkpoint
whose batch committed but whose version row did not (the row is re-derived from the note).
"""

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from core_engine.rl.checkpoint import checkpoint_dir, read_trainer_state
from db import BatchStatus, PolicyMetrics, PolicyVersionRecord, Repository

NOTE_FILE = "rlwb_version.json"


class ResumeError(RuntimeError):
    """The output directory does not match the job's recorded versions."""


def write_version_note(record: PolicyVersionRecord) -> None:
    """Store ``record`` beside its checkpoint (written to a temporary file, then renamed)."""
    path = Path(record.checkpoint_path) / NOTE_FILE
    tmp = path.with_name(path.name + ".tmp")
    values = asdict(record)
    values["metrics"]["extra"] = dict(record.metrics.extra)
    tmp.write_text(json.dumps(values))
    os.replace(tmp, path)


def read_version_note(checkpoint: Path) -> PolicyVersionRecord | None:
    path = checkpoint / NOTE_FILE
    if not path.is_file():
        return None
    values = json.loads(path.read_text())
    values["metrics"] = PolicyMetrics(**values["metrics"])
    return PolicyVersionRecord(**values)


def _finish_interrupted_saves(root: Path) -> None:
    """A complete ``version-N.tmp`` whose final directory is gone was interrupted between
    the two steps of its rename: finish it. Any other temporary directory is dropped."""
    for tmp in root.glob("version-*.tmp"):
        final = tmp.with_name(tmp.name.removesuffix(".tmp"))
        if not final.exists() and (tmp / "trainer_state.json").is_file():
            tmp.rename(final)
        else:
            shutil.rmtree(tmp)


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    found = [
        (read_trainer_state(path)["version"], path)
        for path in root.glob("version-*")
        if not path.name.endswith(".tmp") and (path / "trainer_state.json").is_file()
    ]
    return sorted(found)


def _has_accepted_batch(repo: Repository, job_id: int, step: int) -> bool:
    return any(b.step == step for b in repo.list_batches(job_id, status=BatchStatus.ACCEPTED))


def reconcile(repo: Repository, job_id: int, root: str | Path) -> int | None:
    """Make ``root`` hold exactly the job's recorded versions (see the module docstring);
    returns the latest recorded version (None: a fresh job)."""
    root = Path(root)
    if root.is_dir():
        _finish_interrupted_saves(root)
    latest = repo.latest_version(job_id)
    known = None if latest is None else latest.version
    for version, path in _checkpoints(root) if root.is_dir() else []:
        if known is not None and version <= known:
            continue
        if known is None:
            raise ResumeError(
                f"{root} holds checkpoints of another run (version {version}): "
                "use an empty output_dir"
            )
        note = read_version_note(path)
        if version == known + 1 and note is not None and _has_accepted_batch(repo, job_id, known):
            repo.record_policy_version(note)
            known = version
        else:
            shutil.rmtree(path)
    if known and not (checkpoint_dir(root, known) / "trainer_state.json").is_file():
        raise ResumeError(f"the checkpoint of recorded version {known} is missing from {root}")
    return known
