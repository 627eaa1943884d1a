"""A multi-turn episode's segments and finish: stored, read back, checked on the way in, and
added/dropped by 0010."""

import pytest
import sqlalchemy as sa
from sqlalchemy import URL

from db import InvalidValue, Repository, SampleFilter, downgrade, make_engine, upgrade
from tests.db.helpers import make_batch, make_sample, running_job

INF = float("inf")
SEGMENTS = [
    {"role": "assistant", "start": 0, "end": 3, "text": "<tool_call>..", "tool_calls": []},
    {"role": "tool", "start": 3, "end": 5, "text": "42"},
    {"role": "assistant", "start": 5, "end": 6, "text": "42", "reward": 1.0},
]


def _stored(repo: Repository, job_id: int, **fields) -> int:
    batch = repo.record_batch(make_batch(job_id, [make_sample(**fields)], version=0))
    [item] = repo.list_samples(SampleFilter(job_id=job_id, batch_id=batch.id)).items
    return item.id


def test_an_episode_keeps_its_segments_and_finish(repo) -> None:
    job = running_job(repo, versions=1)
    sample_id = _stored(repo, job.id, tokens=6, segments=SEGMENTS, episode_finish="done")
    detail = repo.get_sample(sample_id)
    assert detail.segments == SEGMENTS and detail.episode_finish == "done"
    assert (detail.turns, detail.tool_errors) == (2, 0)
    single = repo.get_sample(_stored(repo, job.id, tokens=6))
    assert single.segments is None and single.episode_finish is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"segments": SEGMENTS[:2]}, "cover 5 tokens for 6 response tokens"),
        ({"segments": [SEGMENTS[0], SEGMENTS[2]]}, "starts at 5, the previous ended at 3"),
        ({"segments": [{"role": "assistant", "start": 0, "end": "6"}]}, "whole-number"),
        ({"segments": SEGMENTS, "episode_finish": "won"}, "'won' is not one of done"),
        ({"episode_finish": "done"}, "an episode needs its segments"),
        ({"segments": [{**SEGMENTS[0], "end": 6, "text": "x" * 70_000}]}, "over 65536"),
        ({"segments": [{**SEGMENTS[0], "end": 6, "text": "a\x00"}]}, r"\.text: contains a NUL"),
        ({"segments": [{**SEGMENTS[0], "end": 6, "text": "a\ud800"}]}, "lone surrogate"),
        ({"segments": [{**SEGMENTS[0], "end": 6}], "response_text": "a\x00"}, "response_text"),
        ({"segments": [{**SEGMENTS[0], "end": 6, "tool_calls": [{"x": INF}]}]}, "not storable"),
    ],
)
def test_inconsistent_episodes_are_refused(repo, fields, problem) -> None:
    job = running_job(repo, versions=1)
    with pytest.raises(InvalidValue, match=problem):
        _stored(repo, job.id, tokens=6, **fields)


def test_an_episode_that_ended_before_its_first_turn_is_stored(repo) -> None:
    """No turn, no segment (its opening left no room for one): stored as its error."""
    job = running_job(repo, versions=1)
    sample = make_sample(
        tokens=0,
        segments=[],
        episode_finish="error",
        finish_reason="error",
        error_code="prompt_too_long",
        reward=None,
        advantage=None,
    )
    batch = make_batch(job.id, [sample], version=0, status="rejected", reasons=("no room",))
    stored = repo.record_batch(batch)
    [item] = repo.list_samples(SampleFilter(job_id=job.id, batch_id=stored.id)).items
    detail = repo.get_sample(item.id)
    assert (detail.segments, detail.episode_finish, detail.turns) == ([], "error", 0)


def test_0010_adds_the_episode_columns_and_its_downgrade_keeps_the_samples(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo, versions=1)
    sample_id = _stored(repo, job.id, tokens=6, segments=SEGMENTS, episode_finish="max_turns")
    repo.close()
    downgrade(empty_database_url, "0009")
    engine = make_engine(empty_database_url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("samples")}
    engine.dispose()
    assert not {"segments", "episode_finish", "turns", "tool_errors"} & columns
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    assert repo.get_sample(sample_id).segments is None
    repo.close()
