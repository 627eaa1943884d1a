from dataclasses import dataclass

import pytest

from db import (
    MAX_PAGE_SIZE,
    FinishReason,
    InvalidValue,
    JobNotFound,
    Repository,
    SampleFilter,
    SampleNotFound,
    SampleSummary,
)
from db.repository.samples import page_statement

from .helpers import make_batch, make_sample, running_job


@dataclass
class Dataset:
    job_id: int
    other_job_id: int
    ids: list[int]  # every sample id of the job, in insertion order


@pytest.fixture
def data(repo: Repository) -> Dataset:
    """Three versions of one job: v0 accepted, v1 rejected (one error), v2 accepted
    (prompt 1 missing, prompt 2 new); plus one sample of another job."""
    job = running_job(repo, versions=3)
    v0 = [
        make_sample(p, g, reward=(2 * p + g) / 4, finish_reason=("stop", "length")[g])
        for p in (0, 1)
        for g in (0, 1)
    ]
    v1 = [
        make_sample(0, 0, version=1, reward=0.1, response_text="Done 100%_ok"),
        make_sample(
            1, 0, version=1, finish_reason="error", error_code="non_finite_logits", reward=None
        ),
    ]
    v2 = [make_sample(p, g, version=2, reward=0.9) for p in (0, 2) for g in (0, 1)]
    repo.record_batch(make_batch(job.id, v0, step=0))
    repo.record_batch(
        make_batch(job.id, v1, version=1, step=1, status="rejected", reasons=("errored",))
    )
    repo.record_batch(make_batch(job.id, v2, version=2, step=2))
    other = running_job(repo)
    repo.record_batch(make_batch(other.id, [make_sample(0, 0, prompt_text="What is 0 + 0?")]))
    ids = [s.id for s in repo.list_samples(SampleFilter(job.id), limit=100).items]
    assert len(ids) == 10
    return Dataset(job.id, other.id, ids)


def _ids(repo: Repository, where: SampleFilter) -> list[int]:
    page = repo.list_samples(where, limit=100)
    assert page.next_cursor is None
    return [s.id for s in page.items]


def _keys(items: list[SampleSummary]) -> list[tuple[int, int, int]]:
    return [(s.policy_version, s.prompt_index, s.group_index) for s in items]


def test_lists_only_the_jobs_samples_in_page_order(repo: Repository, data: Dataset) -> None:
    items = repo.list_samples(SampleFilter(data.job_id), limit=100).items
    assert [s.id for s in items] == sorted(data.ids)
    assert {s.job_id for s in items} == {data.job_id}
    assert _keys(items)[:3] == [(0, 0, 0), (0, 0, 1), (0, 1, 0)]
    first = items[0]
    assert (first.prompt_text, first.response_text) == ("What is 0 + 0?", "answer 0")
    assert (first.response_length, first.reward, first.advantage) == (4, 0.0, 0.5)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"min_version": 1}, [(1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 0, 1), (2, 2, 0), (2, 2, 1)]),
        ({"min_version": 1, "max_version": 1}, [(1, 0, 0), (1, 1, 0)]),
        ({"max_version": 0, "finish_reason": "length"}, [(0, 0, 1), (0, 1, 1)]),
        ({"finish_reason": FinishReason.ERROR}, [(1, 1, 0)]),
        ({"error_code": "non_finite_logits"}, [(1, 1, 0)]),
        ({"min_reward": 0.5, "max_reward": 0.75}, [(0, 1, 0), (0, 1, 1)]),
        ({"max_reward": 0.1}, [(0, 0, 0), (1, 0, 0)]),
        ({"batch_status": "rejected"}, [(1, 0, 0), (1, 1, 0)]),
        (
            {"batch_status": "accepted", "min_version": 1, "max_reward": 0.9},
            [(2, 0, 0), (2, 0, 1), (2, 2, 0), (2, 2, 1)],
        ),
        ({"text": "what is 2"}, [(2, 2, 0), (2, 2, 1)]),  # the prompt, any case
        ({"text": "100%_"}, [(1, 0, 0)]),  # the response; % and _ are literal
        ({"text": "100%x"}, []),
        ({"text": "%"}, [(1, 0, 0)]),
    ],
)
def test_filters(repo: Repository, data: Dataset, where: dict, expected: list) -> None:
    items = repo.list_samples(SampleFilter(data.job_id, **where), limit=100).items
    assert _keys(items) == expected


def test_summary_carries_the_batch_status(repo: Repository, data: Dataset) -> None:
    items = repo.list_samples(SampleFilter(data.job_id, min_version=1, max_version=1)).items
    assert {s.batch_status.value for s in items} == {"rejected"}


def test_keyset_pagination_walks_every_sample_once(repo: Repository, data: Dataset) -> None:
    where = SampleFilter(data.job_id)
    seen, cursor, pages = [], None, 0
    while True:
        page = repo.list_samples(where, cursor=cursor, limit=3)
        seen += [s.id for s in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(data.ids)
    assert pages == 4
    assert repo.list_samples(where, limit=10).next_cursor is None  # exactly one full page


def test_pages_are_stable_while_samples_arrive(repo: Repository, data: Dataset) -> None:
    where = SampleFilter(data.job_id, min_version=2)
    first = repo.list_samples(where, limit=2)
    repo.record_batch(make_batch(data.job_id, [make_sample(5, 0, version=2)], version=2, step=3))
    second = repo.list_samples(where, cursor=first.next_cursor, limit=10)
    assert [s.prompt_index for s in first.items + second.items] == [0, 0, 2, 2, 5]


def test_pages_are_ordered_by_version_then_id(repo: Repository) -> None:
    """A stale sample stored late (asynchronous rollouts) is listed with its version."""
    job = running_job(repo, versions=3)
    repo.record_batch(make_batch(job.id, [make_sample(0, 0, version=2)], version=2))
    repo.record_batch(make_batch(job.id, [make_sample(1, 0, version=0)], version=2))
    repo.record_batch(make_batch(job.id, [make_sample(2, 0, version=1)], version=2))
    where = SampleFilter(job.id)
    first = repo.list_samples(where, limit=2)
    assert [s.prompt_index for s in first.items] == [1, 2]
    rest = repo.list_samples(where, cursor=first.next_cursor)
    assert ([s.prompt_index for s in rest.items], rest.next_cursor) == ([0], None)
    newest = repo.list_samples(where, newest_first=True).items
    assert [s.policy_version for s in newest] == [2, 1, 0]


@pytest.mark.parametrize("rare_matches", [1, 10_000])
def test_reward_filter_is_the_same_through_either_access_path(
    repo: Repository, data: Dataset, rare_matches: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reward ranges are read through the reward index when rare, in page order otherwise."""
    monkeypatch.setattr("db.repository.samples.RARE_MATCHES", rare_matches)
    where = SampleFilter(data.job_id, min_reward=0.25, max_reward=0.9)
    first = repo.list_samples(where, limit=3)
    rest = repo.list_samples(where, cursor=first.next_cursor, limit=100)
    keys = _keys(first.items + rest.items)
    assert keys == [(0, 0, 1), (0, 1, 0), (0, 1, 1), (2, 0, 0), (2, 0, 1), (2, 2, 0), (2, 2, 1)]


def test_newest_first(repo: Repository, data: Dataset) -> None:
    where = SampleFilter(data.job_id)
    page = repo.list_samples(where, limit=4, newest_first=True)
    assert [s.id for s in page.items] == sorted(data.ids, reverse=True)[:4]
    rest = repo.list_samples(where, cursor=page.next_cursor, limit=100, newest_first=True)
    assert [s.id for s in page.items + rest.items] == sorted(data.ids, reverse=True)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda r, d: r.list_samples(SampleFilter(d.job_id), limit=0), InvalidValue, "limit"),
        (
            lambda r, d: r.list_samples(SampleFilter(d.job_id), limit=MAX_PAGE_SIZE + 1),
            InvalidValue,
            f"limit: {MAX_PAGE_SIZE + 1} is outside 1..{MAX_PAGE_SIZE}",
        ),
        (
            lambda r, d: r.list_samples(SampleFilter(d.job_id, finish_reason="eos")),
            InvalidValue,
            "finish_reason: 'eos'",
        ),
        (
            lambda r, d: r.list_samples(SampleFilter(d.job_id, batch_status="ok")),
            InvalidValue,
            "batch_status: 'ok'",
        ),
        (lambda r, d: r.list_samples(SampleFilter(d.job_id + 99)), JobNotFound, "does not exist"),
        (
            lambda r, d: r.list_samples(SampleFilter(d.job_id), cursor="12"),
            InvalidValue,
            "cursor: '12' is not a cursor",
        ),
        (lambda r, d: r.get_sample(max(d.ids) + 1000), SampleNotFound, "does not exist"),
        (lambda r, d: r.compare_versions(d.job_id, 1, 1), InvalidValue, "two different"),
        (lambda r, d: r.compare_versions(d.job_id, 0, 2, offset=-1), InvalidValue, "offset"),
        (
            lambda r, d: r.compare_versions(d.job_id, 0, 2, match_on="seed"),
            InvalidValue,
            "match_on",
        ),
        (lambda r, d: r.compare_versions(d.job_id + 99, 0, 2), JobNotFound, "does not exist"),
    ],
)
def test_bad_queries(repo: Repository, data: Dataset, call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(repo, data)


def test_random_sample_ids_draw_only_from_the_given_versions(
    repo: Repository, data: Dataset
) -> None:
    v0_and_v2 = data.ids[:4] + data.ids[6:]
    assert repo.random_sample_ids(data.job_id, 100, [2, 0]) == v0_and_v2  # oldest first
    drawn = repo.random_sample_ids(data.job_id, 3, [0, 2])
    assert len(drawn) == 3 and set(drawn) <= set(v0_and_v2)
    assert repo.random_sample_ids(data.job_id, 5, []) == []
    with pytest.raises(InvalidValue, match="versions"):
        repo.random_sample_ids(data.job_id, 5, range(MAX_PAGE_SIZE + 1))


def test_get_sample_has_the_arrays(repo: Repository, data: Dataset) -> None:
    sample = repo.get_sample(data.ids[0])
    assert sample.response_token_ids == [100, 101, 102, 103]
    assert sample.behaviour_logprobs == [-0.5, -0.625, -0.75, -0.875]
    assert sample.temperature_logprobs == [-0.25, -0.375, -0.5, -0.625]


@pytest.mark.parametrize("match_on", ["prompt_text", "prompt_index"])
def test_compare_versions_on_the_same_prompts(
    repo: Repository, data: Dataset, match_on: str
) -> None:
    comparisons = repo.compare_versions(data.job_id, 0, 2, match_on=match_on)
    assert [c.prompt_index for c in comparisons] == [0]  # prompt 1 is not in v2, 2 not in v0
    (compared,) = comparisons
    assert compared.prompt_text == "What is 0 + 0?"
    assert _keys(compared.samples_a) == [(0, 0, 0), (0, 0, 1)]
    assert _keys(compared.samples_b) == [(2, 0, 0), (2, 0, 1)]
    assert [s.reward for s in compared.samples_b] == [0.9, 0.9]


def test_compare_versions_orders_and_pages_prompts(repo: Repository, data: Dataset) -> None:
    both = repo.compare_versions(data.job_id, 1, 0)
    assert [c.prompt_index for c in both] == [0, 1]
    assert [len(c.samples_a) for c in both] == [1, 1]  # v1 has one sample per prompt
    assert [len(c.samples_b) for c in both] == [2, 2]
    assert [c.prompt_index for c in repo.compare_versions(data.job_id, 1, 0, limit=1)] == [0]
    paged = repo.compare_versions(data.job_id, 1, 0, limit=1, offset=1)
    assert [c.prompt_index for c in paged] == [1]
    assert repo.compare_versions(data.job_id, 0, 7) == []


def test_compare_matches_text_even_when_indexes_differ(repo: Repository) -> None:
    job = running_job(repo, versions=2)
    repo.record_batch(make_batch(job.id, [make_sample(3, 0, prompt_text="Same prompt")]))
    repo.record_batch(
        make_batch(job.id, [make_sample(8, 0, version=1, prompt_text="Same prompt")], version=1)
    )
    (by_text,) = repo.compare_versions(job.id, 0, 1)
    assert [s.prompt_index for s in by_text.samples_a + by_text.samples_b] == [3, 8]
    assert repo.compare_versions(job.id, 0, 1, match_on="prompt_index") == []


def test_compare_versions_of_two_jobs_even_the_same_version(repo: Repository) -> None:
    """Job A's version 1 against job B's version 1 on the prompts both answered; the other
    versions of either job are left out."""
    a, b = running_job(repo, versions=2), running_job(repo, versions=2)
    for job, version, prompts in ((a, 1, (0, 1)), (b, 1, (1, 2)), (b, 0, (0,))):
        samples = [make_sample(p, 0, version=version, reward=float(job.id)) for p in prompts]
        repo.record_batch(make_batch(job.id, samples, version=version))
    (both,) = repo.compare_samples((a.id, 1), (b.id, 1))
    assert both.prompt_index == 1
    assert [(s.job_id, s.policy_version) for s in both.samples_a] == [(a.id, 1)]
    assert [(s.job_id, s.policy_version) for s in both.samples_b] == [(b.id, 1)]
    (swapped,) = repo.compare_samples((b.id, 1), (a.id, 1))
    assert [s.job_id for s in swapped.samples_a] == [b.id]
    assert repo.compare_samples((a.id, 1), (b.id, 0))[0].prompt_index == 0
    with pytest.raises(InvalidValue, match="two different versions"):
        repo.compare_samples((a.id, 1), (a.id, 1))
    with pytest.raises(JobNotFound):
        repo.compare_samples((a.id, 1), (b.id + 99, 1))


def _batch_ids(repo: Repository, job_id: int) -> list[int]:
    return [b.id for b in repo.list_batches(job_id)]


def test_batch_filter_lists_one_batch(repo: Repository, data: Dataset) -> None:
    v0, v1, v2 = _batch_ids(repo, data.job_id)
    assert _keys(repo.list_samples(SampleFilter(data.job_id, batch_id=v1)).items) == [
        (1, 0, 0),
        (1, 1, 0),
    ]
    where = SampleFilter(data.job_id, batch_id=v2, min_reward=0.5, text="what is 2")
    assert _keys(repo.list_samples(where).items) == [(2, 2, 0), (2, 2, 1)]
    assert _ids(repo, SampleFilter(data.job_id, batch_id=v0, finish_reason="length")) == [
        data.ids[1],
        data.ids[3],
    ]
    assert _ids(repo, SampleFilter(data.job_id, batch_id=v0, batch_status="rejected")) == []
    (other,) = _batch_ids(repo, data.other_job_id)
    assert _ids(repo, SampleFilter(data.job_id, batch_id=other)) == []  # another job's batch
    assert _ids(repo, SampleFilter(data.job_id, batch_id=other + 1000)) == []


def test_batch_filter_pages_in_page_order(repo: Repository, data: Dataset) -> None:
    """A stale sample in a batch is listed with its version, as in any page."""
    job_id = data.job_id
    batch = repo.record_batch(
        make_batch(
            job_id,
            [make_sample(p, 0, version=v) for p, v in ((0, 2), (1, 0), (2, 2), (3, 1))],
            version=2,
            step=3,
        )
    )
    where = SampleFilter(job_id, batch_id=batch.id)
    first = repo.list_samples(where, limit=3)
    rest = repo.list_samples(where, cursor=first.next_cursor, limit=3)
    assert [s.prompt_index for s in first.items + rest.items] == [1, 3, 0, 2]
    assert rest.next_cursor is None and {s.batch_id for s in first.items} == {batch.id}
    newest = repo.list_samples(where, newest_first=True).items
    assert [s.prompt_index for s in newest] == [2, 0, 3, 1]


def test_batch_filter_reads_the_batch_index(repo: Repository, data: Dataset) -> None:
    """Whatever else is filtered, a batch's page is read through its batch index (a job-led
    index would read the whole job)."""
    batch_id = _batch_ids(repo, data.job_id)[0]
    sqlite = repo.engine.dialect.name == "sqlite"
    explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
    for fields in ({}, {"finish_reason": "stop"}, {"error_code": "x"}, {"min_reward": 0.5}):
        where = SampleFilter(data.job_id, batch_id=batch_id, **fields)
        for newest_first in (False, True):
            statement = page_statement(where, "0:0", newest_first).limit(51)
            sql = statement.compile(repo.engine, compile_kwargs={"literal_binds": True})
            with repo.engine.connect() as connection:
                if not sqlite:
                    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
                plan = " ".join(
                    str(row[-1]) for row in connection.exec_driver_sql(f"{explain}{sql}")
                )
            assert "ix_samples_batch_version" in plan, (fields, plan)
            assert "ix_samples_job" not in plan, (fields, plan)
