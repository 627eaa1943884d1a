"""The UI's views of a job trained for real (the trainer, the tiny checkpoint): per-token
training diagnostics, the audit verdict and the token diff (both computed by the worker's
functions, which the fake queue runs in the test process), the CSV export and Clone job."""

import csv
import dataclasses
import math
import re

import pytest

from db import SampleFilter
from tests.workers.helpers import train_config
from ui.diagnostics import token_diagnostics
from ui.handlers.audit import audit_view
from ui.handlers.clone import clone_form
from ui.handlers.export import metrics_csv
from ui.handlers.launch import train_config as form_config
from ui.handlers.samples import sample_detail, search_samples
from ui.handlers.token_diff import token_diff_view
from workers.jobs import run_job
from workers.settings import Settings


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    """A 2-step job on the tiny checkpoint whose groups have mixed rewards, so it trains."""
    from core_engine.toy import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("trained")
    model = save_tiny_checkpoint(world["model"].parent / "real", arch="llama")
    config = train_config(
        str(model), steps=2, group_size=4, lr=0.01, reward="regex:.*7.*", clip_eps=0.1
    )
    repo = world["repo"]
    job = repo.create_job("train", config, total_steps=2)
    settings = dataclasses.replace(Settings.from_env(), data_dir=root / "data")
    assert run_job(repo, job.id, settings).status == "succeeded"
    return repo.get_job(job.id)


def _trained_sample(repo, job_id):
    for summary in repo.list_samples(SampleFilter(job_id)).items:
        detail = repo.get_sample(summary.id)
        if detail.trainer_logprobs is not None and detail.advantage:
            return detail
    raise AssertionError("no trained sample")


def test_the_sample_view_shows_per_token_diagnostics(services, trained):
    detail = _trained_sample(services.repository, trained.id)
    html = sample_detail(services, detail.id)
    rows = re.findall(r'<tr class="diag" data-clipped="(true|false)"', html)
    assert len(rows) == len(detail.response_token_ids)
    for row, old, new in zip(
        token_diagnostics(detail, 0.1),
        detail.temperature_logprobs,
        detail.trainer_logprobs,
        strict=True,
    ):
        assert row.ratio == pytest.approx(math.exp(new - old))
        assert row.clipped == _clip_stops_gradient(row.ratio, detail.advantage, 0.1)
    assert "clip ε 0.1" in html


def test_an_untrained_sample_says_it_has_no_diagnostics(services, job):
    first = services.repository.list_samples(SampleFilter(job.id)).items[0]
    html = sample_detail(services, first.id)
    assert "No training diagnostics" in html and 'class="diag"' not in html


def _clip_stops_gradient(ratio: float, advantage: float, clip_eps: float) -> bool:
    """Independent truth: autograd of PPO's surrogate min(r A, clip(r) A) in r is 0."""
    import torch

    r = torch.tensor(ratio, dtype=torch.float64, requires_grad=True)
    surrogate = torch.minimum(r * advantage, r.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    surrogate.backward()
    return float(r.grad) == 0.0


@pytest.mark.parametrize("ratio", [0.5, 0.79, 0.81, 1.0, 1.1, 1.19, 1.21, 1.5, 3.0])
@pytest.mark.parametrize("advantage", [-1.3, 0.7])
def test_clip_rule_is_where_the_surrogate_stops_the_gradient(ratio, advantage):
    from core_engine.rl.objective.clip import clip_active

    assert clip_active(ratio, advantage, 0.2) == _clip_stops_gradient(ratio, advantage, 0.2)


def test_the_samples_filter_finds_large_ratios(services, trained):
    gaps = [
        max(abs(a - b) for a, b in zip(d.trainer_logprobs, d.temperature_logprobs, strict=True))
        for d in (
            services.repository.get_sample(s.id)
            for s in services.repository.list_samples(SampleFilter(trained.id), limit=500).items
        )
        if d.trainer_logprobs
    ]
    distinct = sorted(set(gaps))
    middle = len(distinct) // 2
    threshold = (distinct[middle - 1] + distinct[middle]) / 2  # clear of float32 rounding
    frame, _, _ = search_samples(
        services, trained.id, "", "", "any", "", "", "", "any", "", False, threshold
    )
    assert len(frame) == sum(gap >= threshold for gap in gaps) > 0
    assert (
        "negative"
        in search_samples(services, trained.id, "", "", "any", "", "", "", "any", "", False, "-1")[
            2
        ]
    )


def test_audit_a_sample_from_the_ui(services, trained):
    detail = _trained_sample(services.repository, trained.id)
    verdict = audit_view(services, detail.id)
    assert verdict.startswith("**PASS**") and "tolerance 0.0001" in verdict
    assert "Choose a sample" in audit_view(services, None)
    assert "does not exist" in audit_view(services, 10**9)


def test_token_diff_colours_each_token_by_the_change(services, trained):
    detail = next(
        services.repository.get_sample(s.id)
        for s in services.repository.list_samples(
            SampleFilter(trained.id, min_version=1, max_version=1)
        ).items
    )
    html = token_diff_view(services, detail.id, 1, 2)
    deltas = [float(d) for d in re.findall(r'class="diff-tok" data-delta="([^"]+)"', html)]
    assert len(deltas) == len(detail.response_token_ids)
    # version 1 generated the response: scored under it, it has the stored log-probs
    stored = detail.temperature_logprobs
    answer = services.token_diff(detail.id, 1, 2)
    assert answer["logprobs_a"] == pytest.approx(stored, abs=1e-4)
    assert deltas == pytest.approx(
        [b - a for a, b in zip(answer["logprobs_a"], answer["logprobs_b"], strict=True)],
        abs=1e-5,
    )
    assert "no policy version 7" in token_diff_view(services, detail.id, 1, 7)
    assert "choose a sample" in token_diff_view(services, None, 1, 2)


def test_metrics_export_as_csv(services, trained):
    with open(metrics_csv(services, trained.id), newline="") as file:
        rows = list(csv.DictReader(file))
    versions = services.repository.list_versions(trained.id)
    assert [int(r["version"]) for r in rows] == [v.version for v in versions]
    assert float(rows[1]["loss"]) == pytest.approx(versions[1].metrics.loss)
    assert "sample_reward_mean" in rows[0] and "grad_norm" in rows[1]
    assert metrics_csv(services, None) is None and metrics_csv(services, 10**9) is None


def test_clone_fills_the_launch_form_with_the_jobs_config(services, trained, job):
    values, message = clone_form(services, trained.id)
    assert f"#{trained.id}" in message
    assert values["model"] == trained.config["model"] and values["steps"] == 2
    assert values["group_size"] == 4 and values["clip_eps"] == 0.1
    assert values["reward"] == "regex:.*7.*" and values["task"] == "always7"
    assert values["lr"] == 0.01 and values["temperature"] == 1.0  # the trainer's default
    config = form_config(services, **values)  # the form, as filled, launches the same job
    assert {k: config[k] for k in ("steps", "group_size", "lr", "reward")} == {
        k: trained.config[k] for k in ("steps", "group_size", "lr", "reward")
    }
    assert clone_form(services, None)[0] == {}
    compare = services.repository.create_job("compare", {"job_id": job.id, "versions": [0, 1]})
    assert "not a train job" in clone_form(services, compare.id)[1]
