"""Where a preempted sample resumed (its K/V recomputed by the version of that token): stored,
checked on the way in, and added/dropped by 0009."""

import pytest
from sqlalchemy import URL

from db import InvalidValue, Repository, SampleFilter, downgrade, upgrade
from tests.db.helpers import make_batch, make_sample, running_job, sample_columns


def _stored(repo: Repository, job_id: int, **fields) -> int:
    batch = repo.record_batch(make_batch(job_id, [make_sample(**fields)], version=2))
    [item] = repo.list_samples(SampleFilter(job_id=job_id, batch_id=batch.id)).items
    return item.id


def test_resume_points_are_kept_and_none_is_stored_as_none(repo) -> None:
    job = running_job(repo, versions=3)
    resumed = _stored(repo, job.id, version=1, tokens=5, resumed_at=[2, 4])
    assert repo.get_sample(resumed).resumed_at == [2, 4]
    assert repo.get_sample(_stored(repo, job.id, version=1, tokens=5)).resumed_at is None
    assert (
        repo.get_sample(_stored(repo, job.id, version=1, tokens=5, resumed_at=[])).resumed_at
        is None
    )


@pytest.mark.parametrize(
    ("indexes", "problem"),
    [
        ([0], "indexes in 1..5"),
        ([6], "indexes in 1..5"),
        ([3, 2], "must increase"),
        ([True], "1..5"),
    ],
)
def test_inconsistent_resume_points_are_refused(repo, indexes, problem) -> None:
    job = running_job(repo, versions=3)
    with pytest.raises(InvalidValue, match=problem):
        _stored(repo, job.id, version=1, tokens=5, resumed_at=indexes)


def test_0009_adds_resumed_at_and_its_downgrade_keeps_the_samples(empty_database_url: URL) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo, versions=3)
    sample_id = _stored(repo, job.id, version=1, tokens=5, resumed_at=[3])
    repo.close()
    downgrade(empty_database_url, "0008")
    assert "resumed_at" not in sample_columns(empty_database_url)
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    assert repo.get_sample(sample_id).resumed_at is None
    repo.close()
