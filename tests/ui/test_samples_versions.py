"""The Samples tab and per-token policy versions: a sample several versions sampled shows its
runs and, coloured by version, which version sampled each token; its audit lists each run.
A sample one version sampled looks as before."""

import re

import pytest

from db import BatchRecord, PolicyVersionRecord, SampleFilter
from tests.ui.helpers import _sample, encode
from ui.handlers.audit import audit_view, verdict
from ui.handlers.samples import open_sample, sample_detail
from ui.token_versions import VERSION, runs_text, version_colour

RESPONSE = "<b>&12"  # stored text: comes out escaped


@pytest.fixture(scope="module")
def in_flight(world) -> int:
    """A job whose one sample was sampled by version 1 (2 tokens) then 2 (the rest)."""
    repo, model = world["repo"], world["model"]
    job = repo.create_job("train", {"model": str(model)})
    repo.mark_running(job.id)
    for version in range(3):
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent))
    ids = encode(model, RESPONSE)
    sample = _sample(
        model,
        1,
        0,
        0,
        response_text=RESPONSE,
        response_token_ids=ids,
        behaviour_logprobs=[-0.5] * len(ids),
        temperature_logprobs=[-0.5] * len(ids),
        token_versions=[[1, 2], [2, len(ids) - 2]],
    )
    batch = repo.record_batch(BatchRecord(job.id, 2, 0, "accepted", [sample]))
    [item] = repo.list_samples(SampleFilter(job.id, batch_id=batch.id)).items
    return item.id


def _versions(html: str) -> list[str]:
    return re.findall(r'data-version="(\d+)"', html)


def test_runs_read_as_token_ranges() -> None:
    assert runs_text([[3, 12], [4, 4]]) == "tokens 0-11: v3, 12-15: v4"
    assert runs_text([]) == "no tokens"


def test_an_in_flight_sample_shows_its_runs_and_its_tokens_by_version(services, world, in_flight):
    tokens = len(encode(world["model"], RESPONSE))
    by_logprob = sample_detail(services, in_flight)
    assert f"tokens 0-1: v1, 2-{tokens - 1}: v2" in by_logprob
    assert _versions(by_logprob) == []  # coloured by log-prob, as before
    by_version = sample_detail(services, in_flight, VERSION)
    assert _versions(by_version) == ["1", "1"] + ["2"] * (tokens - 2)
    assert f"background:{version_colour(0)}" in by_version
    assert f"background:{version_colour(1)}" in by_version
    # recoloured in place: the response's spans carry versions instead of log-probs
    assert "Response (policy version per token)" in by_version
    assert "Response (behaviour log-prob per token)" not in by_version
    assert by_version.count("data-logprob=") == by_logprob.count("data-logprob=") - tokens
    block = by_version.split("Response (policy version per token)")[1].split("</div>")[1]
    assert "<b>" not in block and ">&lt;</span>" in block and ">&amp;</span>" in block
    assert open_sample(services, in_flight, VERSION) == (by_version, "")


def test_a_sample_of_one_version_looks_as_before_and_can_be_coloured_by_it(services, job):
    [first] = services.repository.list_samples(SampleFilter(job.id, min_version=2), limit=1).items
    html = sample_detail(services, first.id)
    assert "token-versions" not in html and _versions(html) == []
    by_version = sample_detail(services, first.id, VERSION)
    assert set(_versions(by_version)) == {"2"} and "tokens 0-" in by_version


def test_the_audit_lists_each_run(services, in_flight):
    shown = audit_view(services, in_flight)  # the job kept no checkpoints
    assert shown.startswith("**WEIGHTS NOT KEPT**")
    assert "- tokens 0-1 · version 1 · **weights not kept**" in shown
    assert "version 2 · **not checked** · needs the K/V of version 1" in shown
    assert "Checked: tokens 0\\-1 re\\-scored under version 1" in shown
    assert "the versions that computed them in the engine" in shown


def test_a_verdict_of_several_runs_is_a_sentence_then_a_line_per_run() -> None:
    result = {
        "sample_id": 5,
        "version": 3,
        "tokens": 16,
        "tolerance": 1e-4,
        "status": "fail",
        "max_abs_diff": 0.01,
        "checks": "tokens 0-11 re-scored under version 3, tokens 12-15 under version 4",
        "segments": [
            {"version": 3, "first_token": 0, "last_token": 11, "max_abs_diff": 2e-6},
            {"version": 4, "first_token": 12, "last_token": 15, "max_abs_diff": 0.01},
        ],
    }
    result["segments"][0]["status"], result["segments"][1]["status"] = "pass", "fail"
    lines = verdict(result).split("\n")
    assert lines[0].startswith("**FAIL** · sample #5 (version 3, 16 tokens)")
    assert "each token's version's kept weights" in lines[0]
    assert lines[2:4] == [
        "- tokens 0-11 · version 3 · **pass** · max diff 2e-06",
        "- tokens 12-15 · version 4 · **fail** · max diff 0.01",
    ]
