"""The rank that generated a sample (a job over several devices, issue 31): stored, checked on
the way in, and added/dropped by 0011 (the samples stored before it: NULL, not recorded)."""

import pytest
from sqlalchemy import URL

from db import InvalidValue, Repository, SampleFilter, downgrade, upgrade
from tests.db.helpers import make_batch, make_sample, running_job, sample_columns


def _stored(repo: Repository, job_id: int, **fields) -> int:
    batch = repo.record_batch(make_batch(job_id, [make_sample(**fields)]))
    [item] = repo.list_samples(SampleFilter(job_id=job_id, batch_id=batch.id)).items
    return item.id


def test_each_samples_rank_is_kept_and_none_stays_none(repo) -> None:
    job = running_job(repo, devices=2)
    assert [repo.get_sample(_stored(repo, job.id, rank=rank)).rank for rank in (0, 1)] == [0, 1]
    assert repo.get_sample(_stored(repo, job.id)).rank is None  # not recorded


@pytest.mark.parametrize("rank", [-1, 1.0, True, "1"])
def test_a_rank_that_is_not_a_whole_number_from_0_is_refused(repo, rank) -> None:
    job = running_job(repo, devices=2)
    with pytest.raises(InvalidValue, match=r"samples\[0\]\.rank: .* is not a whole number >= 0"):
        _stored(repo, job.id, rank=rank)


def test_0011_adds_the_rank_and_leaves_the_samples_before_it_unrecorded(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo, devices=2)
    sample_id = _stored(repo, job.id, rank=1)
    assert repo.get_sample(sample_id).rank == 1
    repo.close()

    downgrade(empty_database_url, "0010")
    assert "rank" not in sample_columns(empty_database_url)
    upgrade(empty_database_url)
    assert "rank" in sample_columns(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_sample(sample_id)  # as if stored before 0011: kept, its rank NULL (not 0)
    assert kept.prompt_text == make_sample().prompt_text and kept.rank is None
    repo.close()
