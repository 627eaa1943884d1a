"""Per-token policy versions of a sample (in-flight weight updates): stored as runs only when
several versions sampled the response, checked on the way in, and added/dropped by 0008."""

import pytest
from sqlalchemy import URL

from db import InvalidValue, Repository, SampleFilter, downgrade, upgrade
from tests.db.helpers import make_batch, make_sample, running_job, sample_columns


def _stored(repo: Repository, job_id: int, **fields) -> int:
    batch = repo.record_batch(make_batch(job_id, [make_sample(**fields)], version=2))
    [item] = repo.list_samples(SampleFilter(job_id=job_id, batch_id=batch.id)).items
    return item.id


def test_runs_of_several_versions_are_kept_and_one_run_is_stored_as_none(repo) -> None:
    job = running_job(repo, versions=3)
    several = _stored(repo, job.id, version=1, tokens=5, token_versions=[[1, 3], [2, 2]])
    detail = repo.get_sample(several)
    assert detail.token_versions == [[1, 3], [2, 2]]
    assert detail.version_runs == [[1, 3], [2, 2]]
    one = repo.get_sample(_stored(repo, job.id, version=2, tokens=4, token_versions=[[2, 4]]))
    assert one.token_versions is None and one.version_runs == [[2, 4]]
    old = repo.get_sample(_stored(repo, job.id, version=0, tokens=3))
    assert old.token_versions is None and old.version_runs == [[0, 3]]


@pytest.mark.parametrize(
    ("runs", "problem"),
    [
        ([[0, 3], [2, 2]], "first run's version 0 is not the sample's policy_version 1"),
        ([[1, 3], [1, 2]], "versions must increase"),
        ([[1, 3], [3, 2]], "after the batch's 2"),
        ([[1, 3], [2, 1]], "4 tokens in runs for 5 response tokens"),
        ([[1, 5], [2, 0]], "at least one token"),
        ([[1, 3], [2, 2, 9]], "expected \\[\\[version, count\\]"),
        ([[1, 3], [2, True]], "expected \\[\\[version, count\\]"),
    ],
)
def test_inconsistent_runs_are_refused(repo, runs, problem) -> None:
    job = running_job(repo, versions=3)
    sample = make_sample(version=1, tokens=5, token_versions=runs)
    with pytest.raises(InvalidValue, match=problem):
        repo.record_batch(make_batch(job.id, [sample], version=2))


def test_0008_adds_token_versions_and_its_downgrade_keeps_the_samples(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo, versions=3)
    sample_id = _stored(repo, job.id, version=1, tokens=5, token_versions=[[1, 3], [2, 2]])
    repo.close()

    downgrade(empty_database_url, "0007")
    assert "token_versions" not in sample_columns(empty_database_url)
    upgrade(empty_database_url)
    assert "token_versions" in sample_columns(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_sample(sample_id)
    assert kept.policy_version == 1 and kept.token_versions is None
    assert kept.version_runs == [[1, 5]]  # what a sample stored before 0008 reads as
    repo.close()
