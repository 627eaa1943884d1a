"""Jobs: a pipelined job's lag, importance weights and timings plotted per version; a sync
job's page shows none of these plots, not even as "no data yet"."""

import pytest

from db import PolicyVersionRecord
from ui.handlers.jobs import job_page
from ui.plots import PLOTS, has_data, shown
from workers.records import policy_metrics

PIPELINE_PLOTS = ("policy-lag", "importance", "pipeline-time")


def _trainer_metrics(version: int) -> dict[str, float]:
    """What the trainer reports for a version of a ``one_step`` job."""
    return {
        "reward_mean": 0.5,
        "loss": 0.1,
        "policy_lag_mean": 0.5 * version,
        "policy_lag_max": 1.0,
        "policy_lag/0": 10.0,
        "policy_lag/1": 10.0 * version,
        "is_weight_mean": 1.0 + 0.1 * version,
        "is_weight_max": 3.0,
        "is_truncated_fraction": 0.05,
        "generate_s": 2.0,
        "train_s": 1.5,
        "wait_s": 0.5 * version,
    }


@pytest.fixture(scope="module")
def pipelined(world):
    repo = world["repo"]
    config = {"model": "demo", "task": "always7", "pipeline": "one_step", "max_policy_lag": 1}
    job = repo.create_job("train", config)
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))  # the loaded weights
    for version in (1, 2):
        metrics = policy_metrics(_trainer_metrics(version), 1, 0)
        record = PolicyVersionRecord(job.id, version, version - 1, metrics=metrics)
        repo.record_policy_version(record)
    return job


def _page(services, job_id):
    _, _, frames, hidden = job_page(services, job_id)
    return {spec.key: (spec, frame) for spec, frame in zip(PLOTS, frames, strict=True)}, hidden


def _series(frame, name):
    """The series' values of versions 1 and 2 (version 0, the loaded weights, has none)."""
    values = frame[frame["series"] == name].set_index("version")["value"]
    assert values.isna()[0]
    return values[[1, 2]].tolist()


def test_the_pipeline_metrics_are_plotted_per_version(services, pipelined):
    page, hidden = _page(services, pipelined.id)
    lag, weights, time = (page[key][1] for key in PIPELINE_PLOTS)
    assert lag["version"].tolist() == [0, 1, 2, 0, 1, 2]
    assert _series(lag, "lag mean") == [0.5, 1.0] and _series(lag, "lag max") == [1.0, 1.0]
    assert _series(weights, "IS weight mean") == pytest.approx([1.1, 1.2])
    assert _series(weights, "IS weight max") == [3.0, 3.0]
    assert _series(weights, "truncated fraction") == [0.05, 0.05]
    assert _series(time, "wait") == [0.5, 1.0] and _series(time, "train") == [1.5, 1.5]
    assert _series(time, "generate") == [2.0, 2.0]
    for key in PIPELINE_PLOTS:
        assert shown(*page[key], hidden) == (True, False)


def test_a_sync_job_shows_no_pipeline_plot_nor_its_note(services, job):
    page, hidden = _page(services, job.id)
    for key in PIPELINE_PLOTS:
        spec, frame = page[key]
        assert not has_data(frame) and shown(spec, frame, hidden) == (False, False)
    heldout = page["heldout"]
    assert shown(*heldout, hidden) == (False, True)  # the others still say "no data yet"
