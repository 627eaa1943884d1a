"""Samples tab handlers: filters, keyset pages, rejected batches, the token-level view."""

import re
from typing import Any

import pytest
from markdown_it import MarkdownIt

from core_engine.user_files import WEIGHTS_FILE
from db import BatchRecord, PolicyVersionRecord, SampleFilter
from tests.ui.helpers import GROUP, PROMPTS, TRICKY, _sample
from ui.handlers import samples as samples_module
from ui.handlers.audit import audit_view
from ui.handlers.samples import open_sample, rejected_batches, sample_detail, search_samples
from ui.render import from_inert


def read(page):
    """A page with its info line as the reader sees it (it is shown inert)."""
    table, state, info = page
    return table, state, from_inert(info)


def turn_page(services, state, step):
    return read(samples_module.turn_page(services, state, step))


def batch_samples(services, job_id, batch_id):
    return read(samples_module.batch_samples(services, job_id, batch_id))


def search(services, job_id, **filters: Any):
    values = {
        "min_version": None,
        "max_version": None,
        "finish_reason": "any",
        "error_code": "",
        "min_reward": None,
        "max_reward": None,
        "batch_status": "any",
        "text": "",
        "newest_first": False,
    }
    values.update(filters)
    return read(search_samples(services, job_id, **values))


def all_ids(world) -> list[int]:
    page = world["repo"].list_samples(SampleFilter(world["job"].id), limit=1000)
    return [s.id for s in page.items]


def test_pages_cover_every_sample_once_in_order(services, world, job, monkeypatch):
    monkeypatch.setattr(samples_module, "PAGE_SIZE", 7)
    table, state, info = search(services, job.id)
    seen = table["sample"].tolist()
    assert info.startswith("Page 1 · 7 samples · more on the next page")
    while "more on the next page" in info:
        table, state, info = turn_page(services, state, 1)
        seen += table["sample"].tolist()
    assert seen == all_ids(world) and len(seen) == 4 * len(PROMPTS) * GROUP + 2
    pages = -(-len(seen) // 7)
    assert info.startswith(f"Page {pages} · {len(seen) - 7 * (pages - 1)} samples · last page")
    table, state, info = turn_page(services, state, 1)  # past the end: stays on the last page
    assert info.startswith(f"Page {pages} ")
    table, state, info = turn_page(services, state, -1)
    assert info.startswith(f"Page {pages - 1} · 7 samples")
    assert table["sample"].tolist() == seen[7 * (pages - 2) : 7 * (pages - 1)]


def test_newest_first(services, world, job):
    table, _, _ = search(services, job.id, newest_first=True)
    assert table["sample"].tolist() == sorted(all_ids(world), reverse=True)[:50]
    assert table["version"].tolist()[0] == 3


def test_samples_say_whether_their_versions_weights_are_kept(services, world, tmp_path):
    repo, model_dir = world["repo"], world["model"]
    job = repo.create_job("train", {"model": str(model_dir), "task": "always7"}, total_steps=2)
    repo.mark_running(job.id)
    kept, pruned = tmp_path / "version-00001", tmp_path / "version-00000"
    kept.mkdir()  # version 0's folder was never made (pruned); version 2 saved nothing
    (kept / WEIGHTS_FILE).write_bytes(b"")  # a kept version's folder holds its weights file
    for version, folder in enumerate((pruned, kept, None)):
        path = None if folder is None else str(folder)
        repo.record_policy_version(PolicyVersionRecord(job.id, version, None, path))
        samples = [_sample(model_dir, version, 0, group) for group in range(2)]
        repo.record_batch(BatchRecord(job.id, version, version, "accepted", samples))
    table, _, _ = search(services, job.id)
    marks = dict(zip(table["version"], table["weights"], strict=True))
    assert marks == {0: "not kept", 1: "kept", 2: "not kept"}


def test_the_prompt_column_shows_the_users_problem_not_the_system_prompt(services, world):
    repo, model_dir = world["repo"], world["model"]
    job = repo.create_job("train", {"model": str(model_dir), "task": "always7"}, total_steps=1)
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))
    system = "You are a careful solver. Use the calculator tool for every step. " * 3
    problems = ["Tom has 3 apples and buys 4 more.", "A train goes 60 km in 2 hours."]
    samples = [
        _sample(
            model_dir,
            0,
            index,
            0,
            prompt_text=f"<|system|>{system}<|user|>{problem}<|assistant|>",
            prompt_messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": problem},
            ],
        )
        for index, problem in enumerate(problems)
    ]
    repo.record_batch(BatchRecord(job.id, 0, 0, "accepted", samples))
    table, _, _ = search(services, job.id)
    assert table["prompt"].tolist() == problems


def test_a_text_search_that_stops_at_its_bound_says_so(services, world, job, monkeypatch):
    """Each page of a text search reads a bounded number of samples (here 10, really
    `TEXT_SEARCH_ROWS`): a miss says how many and how to narrow it; the next page searches on."""
    from db.repository import samples as repository_samples

    monkeypatch.setattr(repository_samples, "TEXT_SEARCH_ROWS", 10)
    table, state, info = search(services, job.id, text="no such text", newest_first=True)
    assert table.empty
    assert "searched 10 samples for this page: refine your search (versions, reward" in info
    pages = 1
    while "searched 10 samples" in info:
        table, state, info = turn_page(services, state, 1)
        pages += 1
        assert table.empty
    assert "last page" in info and pages == -(-len(all_ids(world)) // 10)


@pytest.mark.parametrize(
    "filters, check",
    [
        ({"finish_reason": "error"}, lambda t: t["error"].tolist() == ["kv_exhausted"]),
        ({"error_code": "kv_exhausted"}, lambda t: t["finish"].tolist() == ["error"]),
        ({"min_reward": "1"}, lambda t: len(t) == 30 and set(t["reward"]) == {"1"}),
        ({"max_reward": 0.5, "min_reward": -1}, lambda t: set(t["reward"]) == {"0"}),
        ({"batch_status": "rejected"}, lambda t: len(t) == 2),
        ({"text": "42"}, lambda t: set(t["prompt"]) == {"42?"} and len(t) == 4 * GROUP),
        ({"min_version": "2", "max_version": 3}, lambda t: set(t["version"]) == {2, 3}),
    ],
)
def test_filters(services, job, filters, check):
    table, _, info = search(services, job.id, **filters)
    assert check(table), (filters, table)
    assert re.search(r"· \d\.\d{3} s$", info)


@pytest.mark.parametrize(
    "job_id, filters, message",
    [
        (None, {}, "choose a job"),
        ("x", {}, "job: 'x' is not a number"),
        (999, {}, "job 999 does not exist"),
        (1, {"min_version": 3, "max_version": 1}, "version range is empty"),
        (1, {"min_reward": "2", "max_reward": "1"}, "reward range is empty"),
        (1, {"min_reward": "high"}, "min reward: 'high' is not a number"),
        (1, {"min_version": "1.5"}, "not a whole number"),
    ],
)
def test_impossible_filters_are_explained(services, job_id, filters, message):
    table, state, info = search(services, job_id, **filters)
    assert table.empty and state == {} and message in info
    assert turn_page(services, state, 1)[2] == "**Search first.**"


def test_a_rejected_batch_lists_its_samples_and_reasons(services, job):
    rejected = rejected_batches(services, job.id)
    assert len(rejected) == 1
    batch = rejected.iloc[0]
    assert batch["reasons"] == "sample 1: error/kv_exhausted: no free KV pages"
    table, state, info = batch_samples(services, job.id, batch["batch"])
    assert len(table) == 2 and set(table["batch"]) == {batch["batch"]}
    assert "batch 3 (rejected): sample 1: error/kv_exhausted" in info
    assert turn_page(services, state, 1)[0].equals(table)
    assert "has no batch 999" in batch_samples(services, job.id, 999)[2]
    assert rejected_batches(services, None).empty


def test_a_large_batch_is_paged_through_the_batch_filter(services, world, job, monkeypatch):
    monkeypatch.setattr(samples_module, "PAGE_SIZE", 5)
    accepted = world["repo"].list_batches(job.id, status="accepted", limit=1)[0]
    table, state, info = batch_samples(services, job.id, accepted.id)
    seen = table["sample"].tolist()
    assert f"batch {accepted.id} (accepted): no reasons · more on the next page" in info
    while "more on the next page" in info:
        table, state, info = turn_page(services, state, 1)
        seen += table["sample"].tolist()
    assert info.startswith("Page 3 · 2 samples")
    where = SampleFilter(job.id, min_version=0, max_version=0)
    expected = [s.id for s in world["repo"].list_samples(where).items if s.batch_id == accepted.id]
    assert seen == expected and len(seen) == accepted.num_samples == len(PROMPTS) * GROUP


def test_a_batch_of_another_job_is_not_shown(services, world, job):
    other = world["repo"].create_job("train", {"model": "demo", "task": "always7"})
    try:
        accepted = world["repo"].list_batches(job.id, limit=1)[0]
        table, state, info = batch_samples(services, other.id, accepted.id)
        assert table.empty and state == {}
        assert info == f"**job {other.id} has no batch {accepted.id}**"
        assert "Choose a job and a batch." in batch_samples(services, job.id, None)[2]
    finally:
        world["repo"].delete_job(other.id)


def test_the_info_line_shows_stored_reasons_inert(services, world):
    """A rejection reason (stored text, e.g. from a reward) makes no link or image."""
    repo = world["repo"]
    other = repo.create_job("train", {"model": "demo", "task": "always7"})
    reason = "reward said ![x](http://e.vil/i.png) see [here](http://e.vil) http://e.vil"
    try:
        repo.mark_running(other.id)
        sample = _sample(world["model"], 0, 0, 0, reward=None, advantage=None)
        batch = repo.record_batch(BatchRecord(other.id, 0, 0, "rejected", [sample], [reason]))
        _, _, info = samples_module.batch_samples(services, other.id, batch.id)
        html = MarkdownIt("commonmark").render(info)
        assert "<a" not in html and "<img" not in html
        assert not re.search(r"https?://|www\.", info)  # nor a GFM autolink literal
        assert reason in from_inert(info)
    finally:
        repo.mark_failed(other.id, "test over")
        repo.delete_job(other.id)


def test_the_detail_colours_each_token_with_its_logprob(services, world, job):
    table, _, _ = search(services, job.id, text="12", max_version=0)
    html = sample_detail(services, table["sample"].iloc[0])
    spans = re.findall(r'<span class="tok"[^>]*>[^<]*</span>', html)
    assert len(spans) == 2  # "1", "2"
    first, second = spans
    assert 'title="token id ' in first and "log-prob -0.0500 (p 0.951)" in first
    assert "temperature-only log-prob -0.0400" in first
    assert first.endswith(">1</span>") and second.endswith(">2</span>")
    assert "background:hsl(119, 75%, 80%)" in first  # likely: green
    assert "background:hsl(" in second and "hsl(119" not in second  # less likely
    for fact in ("policy version", "reward", "advantage", "cached prompt tokens", "finish reason"):
        assert f'data-fact="{fact}"' in html
    assert "<b>user</b>" in html and ">5?</div>" in html  # the prompt messages
    assert 'class="reference"' in html


def test_the_detail_escapes_stored_text_and_shows_errors(services, job):
    table, _, _ = search(services, job.id, batch_status="rejected")
    tricky, errored = table["sample"].tolist()
    html = sample_detail(services, tricky)
    assert TRICKY not in html and "&lt;b&gt;&amp;&quot;x&#x27;" in html
    errored_html = sample_detail(services, errored)
    assert "kv_exhausted: no free KV pages" in errored_html
    assert "∅ (no tokens)" in errored_html
    assert "<b>sample 999 does not exist</b>" in sample_detail(services, 999)
    assert sample_detail(services, None) == "<p>Choose a sample.</p>"


def test_opening_another_sample_clears_the_audit_verdict(services, job):
    table, _, _ = search(services, job.id, min_version=1, max_version=1)  # weights not kept
    audited, other = table["sample"].tolist()[:2]
    assert f"sample #{audited}" in audit_view(services, audited)  # what the box showed
    detail, verdict = open_sample(services, other)
    assert detail == sample_detail(services, other)
    assert f'data-sample-id="{other}"' in detail
    assert verdict == ""


def test_without_a_tokenizer_the_token_ids_are_shown(services, world, job, tmp_path):
    (world["model"] / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    try:
        table, _, _ = search(services, job.id, text="12", max_version=0)
        html = sample_detail(services, table["sample"].iloc[0])
    finally:
        (tmp_path / "tokenizer.json").rename(world["model"] / "tokenizer.json")
    assert re.findall(r">⟨(\d+)⟩</span>", html) and "title=" in html
