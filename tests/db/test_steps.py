"""`Repository.record_step`: a step's batches and its new version, all or nothing."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from db import (
    BatchStatus,
    InvalidTransition,
    InvalidValue,
    JobNotFound,
    PolicyMetrics,
    PolicyVersionRecord,
    Repository,
    SampleFilter,
    VersionConflict,
    VersionNotFound,
)
from db.models import PolicyVersion, RolloutBatch, Sample, VersionSampleStats

from .helpers import make_batch, make_sample, running_job


def _step(job_id: int, version: int = 1, groups: int = 2):
    """Step ``version - 1``: its accepted groups, a rejected group, and the new version."""
    parent = version - 1
    accepted = make_batch(
        job_id,
        [make_sample(p, g, version=parent) for p in range(groups) for g in range(2)],
        version=parent,
        step=parent,
    )
    errored = make_sample(
        groups,
        0,
        version=parent,
        finish_reason="error",
        error_code="kv_exhausted",
        reward=None,
        advantage=None,
    )
    rejected = make_batch(
        job_id,
        [errored, make_sample(groups, 1, version=parent, advantage=None)],
        version=parent,
        step=parent,
        status="rejected",
        reasons=(f"prompt {groups}: error/kv_exhausted",),
    )
    record = PolicyVersionRecord(
        job_id,
        version,
        parent_version=parent,
        checkpoint_path=f"/ckpt/v{version}",
        weights_checksum="sha256:0123",
        metrics=PolicyMetrics(loss=0.5, num_accepted=1, num_rejected=0),
    )
    return [accepted, rejected], record


def _counts(repo: Repository) -> tuple[int, ...]:
    with repo.engine.connect() as connection:
        return tuple(
            connection.scalar(sa.select(sa.func.count()).select_from(model))
            for model in (RolloutBatch, Sample, PolicyVersion, VersionSampleStats)
        )


def test_a_step_stores_its_batches_and_version_together(repo: Repository) -> None:
    job = running_job(repo)
    batches, record = _step(job.id)
    step = repo.record_step(batches, record)
    accepted, rejected = step.batches
    assert (accepted.status, accepted.num_samples) == (BatchStatus.ACCEPTED, 4)
    assert (rejected.status, rejected.rejection_reasons) == (
        BatchStatus.REJECTED,
        ["prompt 2: error/kv_exhausted"],
    )
    assert repo.list_batches(job.id) == step.batches
    assert step.version == repo.latest_version(job.id)
    assert (step.version.version, step.version.parent_version) == (1, 0)
    assert step.version.checkpoint_path == "/ckpt/v1" and step.version.metrics.loss == 0.5
    assert repo.get_job(job.id).current_version == 1
    assert len(repo.list_samples(SampleFilter(job.id)).items) == 6
    (v0, v1) = repo.version_metrics(job.id)
    assert (v0.num_samples, v0.num_accepted_batches, v0.num_rejected_batches) == (6, 1, 1)
    assert v1.recorded == step.version


def test_a_step_without_a_version_or_without_batches(repo: Repository) -> None:
    job = running_job(repo)
    batches, record = _step(job.id)
    rejected_only = repo.record_step([batches[1]], None)
    assert rejected_only.version is None and len(rejected_only.batches) == 1
    assert repo.get_job(job.id).current_version == 0
    version_only = repo.record_step([], record)
    assert version_only.batches == [] and version_only.version.version == 1


@contextmanager
def failing(repo: Repository, when: Callable[[list[str]], bool]) -> Iterator[list[str]]:
    """Raise "connection lost" before the first statement for which ``when(statements so
    far)`` holds; yields those statements (upper case)."""
    seen: list[str] = []

    def fail(connection, cursor, statement, parameters, context, executemany):
        seen.append(statement.lstrip().upper())
        if when(seen):
            raise RuntimeError("connection lost")

    sa.event.listen(repo.engine, "before_cursor_execute", fail)
    try:
        with pytest.raises(RuntimeError, match="connection lost"):
            yield seen
    finally:
        sa.event.remove(repo.engine, "before_cursor_execute", fail)


def _second_batch_written(seen: list[str]) -> bool:
    batches = [i for i, s in enumerate(seen) if s.startswith("INSERT INTO ROLLOUT_BATCHES")]
    return len(batches) == 2 and any(
        s.startswith("INSERT INTO SAMPLES") for s in seen[batches[1] :]
    )


FAILURES = {
    "the version row, after both batches": lambda seen: (
        seen[-1].startswith("INSERT INTO POLICY_VERSIONS") and _second_batch_written(seen)
    ),
    "the job's current version, the last write": lambda seen: (
        seen[-1].startswith("UPDATE JOBS") and any("POLICY_VERSIONS" in s for s in seen)
    ),
    "the samples of the second batch": lambda seen: (
        seen[-1].startswith("INSERT INTO SAMPLES") and _second_batch_written(seen)
    ),
}


@pytest.mark.parametrize("where", FAILURES)
def test_a_failure_part_way_through_the_step_stores_nothing(repo: Repository, where: str) -> None:
    job = running_job(repo)
    before = _counts(repo)
    batches, record = _step(job.id)
    with failing(repo, FAILURES[where]):
        repo.record_step(batches, record)
    assert _counts(repo) == before
    assert repo.get_job(job.id).current_version == 0
    assert repo.record_step(batches, record).version.version == 1  # the step can be redone
    assert len(repo.list_batches(job.id)) == 2


def test_a_version_conflict_stores_none_of_the_batches(repo: Repository) -> None:
    job = running_job(repo, versions=2)
    before = _counts(repo)
    batches, record = _step(job.id)  # version 1 again
    with pytest.raises(VersionConflict):
        repo.record_step(batches, record)
    unknown_parent = PolicyVersionRecord(job.id, 5, parent_version=3)
    with pytest.raises(VersionNotFound):
        repo.record_step(batches, unknown_parent)
    assert _counts(repo) == before


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda b, r: ([b[0], make_batch(b[0].job_id, [])], r), r"batches\[1\]: .*at least one"),
        (
            lambda b, r: (b, PolicyVersionRecord(r.job_id, 1, parent_version=1)),
            "parent_version: 1 is not below version 1",
        ),
        (
            lambda b, r: (b, PolicyVersionRecord(r.job_id + 1, 1, parent_version=0)),
            "a step belongs to one job",
        ),
        (lambda b, r: ([], None), "at least one batch or a policy version"),
    ],
)
def test_invalid_steps_are_refused_whole(repo: Repository, change, match: str) -> None:
    job = running_job(repo)
    before = _counts(repo)
    with pytest.raises(InvalidValue, match=match):
        repo.record_step(*change(*_step(job.id)))
    assert _counts(repo) == before


def test_steps_of_unknown_or_finished_jobs_are_refused(repo: Repository) -> None:
    with pytest.raises(JobNotFound):
        repo.record_step(*_step(424242))
    job = running_job(repo)
    repo.mark_succeeded(job.id)
    with pytest.raises(InvalidTransition, match="cannot record a training step"):
        repo.record_step(*_step(job.id))
