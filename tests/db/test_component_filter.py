"""Samples filtered on one reward component's score (a job with a reward list), in SQL on
the JSON column: SQLite's json_extract, PostgreSQL's ->> cast."""

import pytest

from db import InvalidValue, Repository, SampleFilter

from .helpers import make_batch, make_sample, running_job


def test_samples_with_a_component_at_least_a_minimum(repo: Repository) -> None:
    job = running_job(repo)
    components = [
        {"math": 1.0, "format": 0.0},
        {"math": 0.0, "format": 1.0},
        {"math": 0.5, "format": 0.5},
        None,  # a single reward: no components
    ]
    samples = [
        make_sample(0, group, reward_components=scores) for group, scores in enumerate(components)
    ]
    repo.record_batch(make_batch(job.id, samples))

    def groups(**where) -> list[int]:
        page = repo.list_samples(SampleFilter(job.id, **where), limit=10, newest_first=False)
        return sorted(s.group_index for s in page.items)

    assert groups() == [0, 1, 2, 3]
    assert groups(component="math", min_component=0.5) == [0, 2]
    assert groups(component="format", min_component=1) == [1]
    assert groups(component="math", min_component=-1) == [0, 1, 2]  # none: never matches
    assert groups(component="length", min_component=0) == []
    assert groups(component="math", min_component=0.5, min_reward=2) == []
    with pytest.raises(InvalidValue):
        groups(component="math")
