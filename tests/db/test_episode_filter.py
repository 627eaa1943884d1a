"""Samples filtered on their multi-turn episode, in SQL on the episode columns: how it ended,
at least so many turns, with a tool-call error; keyset pages walk the matches once."""

import pytest

from db import EpisodeFilter, InvalidValue, Repository, SampleFilter

from .helpers import make_batch, make_sample, running_job


def _episode(turns: int, finish: str, errors: int = 0, **fields):
    """A sample of ``turns`` assistant turns (2 tokens each) with a 1-token observation after
    each but the last; the first ``errors`` turns' calls could not be parsed."""
    segments, start = [], 0
    for turn in range(turns):
        segment = {"role": "assistant", "start": start, "end": start + 2, "text": "call"}
        if turn < errors:
            segment["tool_error"] = "no JSON object"
        segments.append(segment)
        start += 2
        if turn < turns - 1:
            segments.append({"role": "tool", "start": start, "end": start + 1, "text": "4"})
            start += 1
    return make_sample(tokens=start, segments=segments, episode_finish=finish, **fields)


@pytest.fixture
def job_id(repo: Repository) -> int:
    """A job's single turns and episodes over two versions, one group index each."""
    job = running_job(repo, versions=2)
    first = [
        make_sample(0, 0),  # a single turn: no episode
        _episode(1, "done", group_index=1),
        _episode(3, "max_turns", group_index=2),
        _episode(2, "tool_parse_error", errors=1, group_index=3),
    ]
    second = [
        _episode(4, "done", errors=2, group_index=4, version=1),
        _episode(2, "done", group_index=5, version=1),
        make_sample(0, 6, version=1),
    ]
    repo.record_batch(make_batch(job.id, first, version=0))
    repo.record_batch(make_batch(job.id, second, version=1, step=1))
    return job.id


def _groups(repo: Repository, job_id: int, limit: int = 50, newest_first=False, **episode):
    """The groups matching ``episode``, page by page (``limit`` a page)."""
    where, cursor, groups = SampleFilter(job_id), None, []
    while True:
        page = repo.list_samples(
            where,
            cursor=cursor,
            limit=limit,
            newest_first=newest_first,
            episode=EpisodeFilter(**episode),
        )
        groups += [s.group_index for s in page.items]
        if page.next_cursor is None:
            return groups
        cursor = page.next_cursor


@pytest.mark.parametrize(
    ("episode", "expected"),
    [
        ({}, [0, 1, 2, 3, 4, 5, 6]),
        ({"episode_finish": "done"}, [1, 4, 5]),
        ({"episode_finish": "tool_parse_error"}, [3]),
        ({"episode_finish": "env_timeout"}, []),
        ({"min_turns": 2}, [2, 3, 4, 5]),
        ({"min_turns": 3}, [2, 4]),
        ({"min_turns": 0}, [1, 2, 3, 4, 5]),  # every episode, no single turn
        ({"with_tool_errors": True}, [3, 4]),
        ({"episode_finish": "done", "min_turns": 2, "with_tool_errors": True}, [4]),
    ],
)
def test_filters_on_the_episode(repo: Repository, job_id, episode, expected) -> None:
    assert _groups(repo, job_id, **episode) == expected


def test_keyset_pages_of_episodes_walk_every_match_once(repo: Repository, job_id: int) -> None:
    assert _groups(repo, job_id, limit=1, min_turns=2) == [2, 3, 4, 5]
    assert _groups(repo, job_id, limit=1, newest_first=True, min_turns=2) == [5, 4, 3, 2]
    assert _groups(repo, job_id, limit=2, episode_finish="done") == [1, 4, 5]


def test_the_episode_filter_combines_with_the_others(repo: Repository, job_id: int) -> None:
    where = SampleFilter(job_id, min_version=1, text="answer")
    page = repo.list_samples(where, episode=EpisodeFilter(episode_finish="done"))
    assert [s.group_index for s in page.items] == [4, 5]


@pytest.mark.parametrize(
    ("episode", "problem"),
    [
        ({"episode_finish": "won"}, "episode_finish: 'won' is not one of done"),
        ({"min_turns": 1.5}, "min_turns: 1.5 is not a whole number"),
        ({"min_turns": True}, "min_turns: True is not a whole number"),
    ],
)
def test_bad_episode_filters_are_refused(repo: Repository, job_id: int, episode, problem) -> None:
    with pytest.raises(InvalidValue, match=problem):
        repo.list_samples(SampleFilter(job_id), episode=EpisodeFilter(**episode))
