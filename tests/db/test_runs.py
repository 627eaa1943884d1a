"""Several jobs read at once (the Runs view): each metric in one query across the jobs, on
SQLite and PostgreSQL, equal to what each job recorded."""

import pytest
import sqlalchemy as sa

from db import InvalidValue, PolicyMetrics, PolicyVersionRecord, Repository

from .helpers import make_batch, make_sample


def _job(repo: Repository, rewards: list[float | None], heldout: dict[int, float]) -> int:
    job = repo.create_job("train", {"model": "toy"})
    repo.mark_running(job.id)
    for version, reward in enumerate(rewards):
        extra = {"heldout_accuracy": heldout[version]} if version in heldout else {}
        metrics = PolicyMetrics(reward_mean=reward, extra=extra)
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent, metrics=metrics))
    return job.id


def test_the_metrics_of_every_job_in_one_query(repo: Repository) -> None:
    a = _job(repo, [0.1, None, 0.5], {0: 0.25, 2: 0.75})
    b = _job(repo, [0.2, 0.3], {1: 0.5})
    statements = []
    sa.event.listen(repo.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    read = repo.run_metrics([a, b], ["reward_mean", "heldout_accuracy"])
    rewards, heldout = read["reward_mean"], read["heldout_accuracy"]
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 1  # both metrics of both jobs
    assert rewards[a].versions == [0, 1, 2] and rewards[a].values == [0.1, None, 0.5]
    assert rewards[b].values == [0.2, 0.3]
    assert heldout[a].values == [0.25, None, 0.75]
    assert heldout[b].values == [None, 0.5]
    created = [v.created_at for v in repo.list_versions(a)]
    expected = [(t - created[0]).total_seconds() for t in created]
    assert rewards[a].seconds == pytest.approx(expected, abs=1e-3)  # SQLite: milliseconds


def test_final_values_are_each_jobs_newest_recorded_ones(repo: Repository) -> None:
    a = _job(repo, [0.1, 0.2, 0.3, 0.4], {0: 0.25, 2: 0.75})  # none at the last version
    b = _job(repo, [0.2, None], {1: 0.5})
    never = _job(repo, [0.1], {})
    empty = repo.create_job("train", {"model": "toy"}).id
    found = repo.final_values([a, b, never, empty], "heldout_accuracy")
    assert found == {a: (2, 0.75), b: (1, 0.5)}
    assert repo.final_values([b, a], "reward_mean") == {a: (3, 0.4), b: (0, 0.2)}


def test_extra_metrics_by_any_name_are_read_where_recorded(repo: Repository) -> None:
    """Names with LIKE's wildcards, inside other names, or that JSON escapes (a quote; on
    PostgreSQL: SQLite's JSON paths do not find such a name)."""
    escaped = ['held"out'] if repo.engine.dialect.name == "postgresql" else []
    job = repo.create_job("train", {"model": "toy"})
    repo.mark_running(job.id)
    first = {"a_b%": 0.25, "xx": 1.0} | {name: 0.5 for name in escaped}
    for version, extra in enumerate([first, {"x": 2.0}, {"ab%": 3.0}]):
        parent = version - 1 if version else None
        metrics = PolicyMetrics(extra=extra)
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent, metrics=metrics))
    read = repo.run_metrics([job.id], ["a_b%", "x", "xx", *escaped])
    assert {name: read[name][job.id].values for name in read} == {
        "a_b%": [0.25, None, None],
        "x": [None, 2.0, None],
        "xx": [1.0, None, None],
    } | {name: [0.5, None, None] for name in escaped}
    assert repo.final_values([job.id], "x") == {job.id: (1, 2.0)}


def test_a_job_without_versions_has_no_curve_and_unknown_metrics_are_none(repo) -> None:
    a = _job(repo, [0.1], {})
    empty = repo.create_job("train", {"model": "toy"}).id
    found = repo.run_metrics([a, empty], ["no_such_metric"])["no_such_metric"]
    assert list(found) == [a] and found[a].values == [None]


def test_tokens_are_the_response_tokens_of_each_version(repo: Repository) -> None:
    a = _job(repo, [0.1, 0.2], {})
    b = _job(repo, [0.1], {})
    stopped, truncated = (
        make_sample(0, 0, tokens=3),
        make_sample(1, 0, tokens=4, finish_reason="length"),
    )
    repo.record_batch(make_batch(a, [stopped, truncated]))  # two finish reasons: two totals
    repo.record_batch(make_batch(a, [make_sample(0, 0, version=1, tokens=5)], version=1))
    repo.record_batch(
        make_batch(b, [make_sample(0, 0, tokens=2)], status="rejected", reasons=("bad",))
    )
    assert repo.run_tokens([a, b]) == {a: {0: 7, 1: 5}, b: {0: 2}}
    assert repo.token_totals([b, a]) == {a: 12, b: 2}


def test_the_metric_names_the_jobs_recorded(repo: Repository) -> None:
    a = _job(repo, [0.1], {0: 0.5})
    b = _job(repo, [None], {})
    assert repo.run_metric_names([a, b]) == ["reward_mean", "heldout_accuracy"]
    assert repo.run_metric_names([b]) == []


def test_jobs_in_the_order_given_and_bad_selections_refused(repo: Repository) -> None:
    a = _job(repo, [0.1], {})
    b = _job(repo, [0.1], {})
    assert [job.id for job in repo.get_jobs([b, 10**9, a])] == [b, a]
    with pytest.raises(InvalidValue, match="choose 1 to"):
        repo.run_metrics([], ["reward_mean"])
    with pytest.raises(InvalidValue, match="metric"):
        repo.run_metrics([a], ["x" * 201])
    with pytest.raises(InvalidValue, match="at least one"):
        repo.run_metrics([a], [])
