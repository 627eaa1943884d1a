"""A text search reads a bounded number of samples per page (issue 24, item 10): on a miss it
used to read the whole job. A page reads at most `TEXT_SEARCH_ROWS` samples, says so when
they did not fill it, and the next page searches on from there: keyset pages still never
repeat or skip a match."""

import pytest

from db import Repository, SampleFilter
from db.repository.samples import TEXT_SEARCH_ROWS, page_statement

from .helpers import make_batch, make_sample, running_job

TOTAL = TEXT_SEARCH_ROWS + 30  # a job of more samples than one page of a search reads
VERSIONS = 10
NEEDLES = (0, 1, 2, 3, 4, 5_000, TOTAL - 1)  # positions, oldest first, of the matches


@pytest.fixture
def job(repo: Repository) -> tuple[int, list[int]]:
    """A job of `TOTAL` samples over 10 versions; the responses at `NEEDLES` say "NeeDLE";
    returns the job id and its sample ids, oldest first."""
    job = running_job(repo, versions=VERSIONS)
    per_version = TOTAL // VERSIONS
    for version in range(VERSIONS):
        samples = []
        for index in range(per_version):
            position = version * per_version + index
            text = "a NeeDLE here" if position in NEEDLES else f"answer {position}"
            samples.append(make_sample(index, 0, version=version, response_text=text))
        repo.record_batch(make_batch(job.id, samples, version=version, step=version))
    ids = [s.id for s in _pages(repo, SampleFilter(job.id), newest_first=False, limit=1000)[0]]
    assert len(ids) == TOTAL
    return job.id, ids


def _pages(repo: Repository, where: SampleFilter, newest_first: bool, limit: int):
    """Every page of a search: the samples, in order, and each page's ``searched``."""
    items, searched, cursor = [], [], None
    while True:
        page = repo.list_samples(where, cursor=cursor, limit=limit, newest_first=newest_first)
        items += page.items
        searched.append(page.searched)
        if page.next_cursor is None:
            return items, searched
        cursor = page.next_cursor


def test_a_miss_reads_one_bounded_window_per_page(repo: Repository, job) -> None:
    job_id, _ = job
    first = repo.list_samples(SampleFilter(job_id, text="absent"), newest_first=True)
    assert first.items == [] and first.searched == TEXT_SEARCH_ROWS
    assert first.next_cursor is not None  # where the next page searches on
    rest = repo.list_samples(SampleFilter(job_id, text="absent"), cursor=first.next_cursor)
    assert (rest.items, rest.next_cursor, rest.searched) == ([], None, None)


@pytest.mark.parametrize("newest_first", [True, False])
def test_search_pages_find_every_match_once_in_page_order(
    repo: Repository, job, newest_first: bool
) -> None:
    job_id, ids = job
    expected = [ids[position] for position in NEEDLES]
    if newest_first:
        expected.reverse()
    where = SampleFilter(job_id, text="needle")
    items, searched = _pages(repo, where, newest_first, limit=3)
    assert [s.id for s in items] == expected
    assert TEXT_SEARCH_ROWS in searched  # a page stopped at its bound before the job's end
    if newest_first:  # the newest window holds 2 matches: the oldest 5 were never read
        first = repo.list_samples(where, limit=3, newest_first=True)
        assert [s.id for s in first.items] == expected[:2]
        assert first.searched == TEXT_SEARCH_ROWS


def test_the_window_is_in_the_statement(repo: Repository) -> None:
    """Whatever the planner does, the text is tested on at most `TEXT_SEARCH_ROWS` rows."""
    statement = page_statement(SampleFilter(1, text="x"), None, True).limit(51)
    sql = str(statement.compile(repo.engine, compile_kwargs={"literal_binds": True}))
    assert f"LIMIT {TEXT_SEARCH_ROWS}" in sql
    assert sql.index(f"LIMIT {TEXT_SEARCH_ROWS}") < sql.lower().index("like")
