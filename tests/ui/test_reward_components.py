"""A job with a reward list: its components plotted in Jobs, shown and filtered in Samples."""

import pytest

from db import BatchRecord, PolicyMetrics, PolicyVersionRecord
from tests.ui.helpers import _sample
from ui.handlers.jobs import job_page
from ui.handlers.samples import component_choices, sample_detail, search_samples
from ui.plots import PLOTS, has_data

REWARD = [{"name": "numeric_match", "weight": 1.0}, {"name": "format", "weight": 0.2}]


@pytest.fixture(scope="module")
def mixed(world):
    repo, model = world["repo"], world["model"]
    job = repo.create_job("train", {"model": str(model), "task": "always7", "reward": REWARD})
    repo.mark_running(job.id)
    for version in range(2):
        extra = {"reward/numeric_match/mean": 0.5 * version, "reward/format/mean": 0.25}
        extra |= {"reward/format/std": 0.1}
        metrics = PolicyMetrics(reward_mean=0.1, reward_std=0.1, loss=0.1, extra=extra)
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent, metrics=metrics))
        samples = [
            _sample(model, version, 0, g, reward_components={"numeric_match": g % 2, "format": 1.0})
            for g in range(4)
        ]
        repo.record_batch(BatchRecord(job.id, version, version, "accepted", samples))
    return job


def _frames(services, job_id):
    frames = job_page(services, job_id)[2]
    return {spec.key: frame for spec, frame in zip(PLOTS, frames, strict=True)}


def test_the_reward_components_are_plotted_per_version(services, mixed, job):
    frame = _frames(services, mixed.id)["reward-components"]
    assert sorted(set(frame["series"])) == ["format", "numeric_match"]
    match = frame[frame["series"] == "numeric_match"]
    assert match["version"].tolist() == [0, 1] and match["value"].tolist() == [0.0, 0.5]
    assert not has_data(_frames(services, job.id)["reward-components"])  # one reward: hidden


def test_a_sample_shows_its_weighted_components(services, mixed):
    page, _, _ = search_samples(services, mixed.id, "", "", "any", "", "", "", "any", "", False)
    html = sample_detail(services, int(page["sample"].iloc[0]))
    assert 'data-fact="reward components"' in html
    assert "format 1 × 0.2" in html and "numeric_match" in html


def test_samples_filter_on_a_component(services, mixed):
    assert component_choices(services, mixed.id) == ["numeric_match", "format"]
    args = (services, mixed.id, "", "", "any", "", "", "", "any", "", False, None)
    page, _, info = search_samples(*args, "numeric_match", "1")
    assert len(page) == 4 and info.startswith("Page 1")  # groups 1 and 3 of both versions
    page, _, info = search_samples(*args, "numeric_match", "")
    assert page.empty and "together" in info
    page, _, _ = search_samples(*args, "format", "1")
    assert len(page) == 8
