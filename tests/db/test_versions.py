from collections import Counter

import pytest

from db import (
    FinishReason,
    InvalidTransition,
    InvalidValue,
    JobNotFound,
    PolicyMetrics,
    PolicyVersionRecord,
    Repository,
    SampleFilter,
    VersionConflict,
    VersionNotFound,
)

from .helpers import make_batch, make_sample, running_job


def test_record_and_read_back_versions(repo: Repository) -> None:
    job = running_job(repo, versions=1)
    metrics = PolicyMetrics(
        reward_mean=0.25,
        reward_std=0.5,
        loss=-0.125,
        kl=0.001,
        train_infer_mismatch=3e-5,
        num_accepted=7,
        num_rejected=1,
        tokens_per_second=1234.5,
        extra={"grad_norm": 0.75, "clip_fraction": 0.0},
    )
    recorded = repo.record_policy_version(
        PolicyVersionRecord(
            job.id,
            1,
            parent_version=0,
            checkpoint_path="/ckpt/job/v1",
            weights_checksum="sha256:abcd",
            metrics=metrics,
        )
    )
    assert recorded.metrics == metrics
    assert (recorded.version, recorded.parent_version) == (1, 0)
    assert (recorded.checkpoint_path, recorded.weights_checksum) == ("/ckpt/job/v1", "sha256:abcd")
    assert repo.latest_version(job.id) == recorded
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == [0, 1]
    assert versions[0].metrics == PolicyMetrics()
    assert versions[1] == recorded
    assert repo.get_version(job.id, 1) == recorded and repo.get_version(job.id, 2) is None


def test_latest_version_of_a_job_without_versions(repo: Repository) -> None:
    job = repo.create_job("train", {})
    assert repo.latest_version(job.id) is None
    assert repo.list_versions(job.id) == []
    with pytest.raises(JobNotFound):
        repo.latest_version(job.id + 1)
    with pytest.raises(JobNotFound):
        repo.get_version(job.id + 1, 0)


@pytest.mark.parametrize("version", [2, 1])
def test_duplicate_or_backward_version_conflicts(repo: Repository, version: int) -> None:
    job = running_job(repo, versions=3)
    with pytest.raises(VersionConflict, match="not greater than the latest recorded version 2"):
        repo.record_policy_version(PolicyVersionRecord(job.id, version))
    assert repo.latest_version(job.id).version == 2
    assert repo.get_job(job.id).current_version == 2


def test_versions_are_per_job(repo: Repository) -> None:
    first = running_job(repo, versions=3)
    second = running_job(repo, versions=1)
    assert repo.record_policy_version(PolicyVersionRecord(second.id, 1)).version == 1
    assert repo.latest_version(first.id).version == 2


def test_versions_may_skip_but_never_go_back(repo: Repository) -> None:
    job = running_job(repo, versions=1)
    repo.record_policy_version(PolicyVersionRecord(job.id, 5, parent_version=0))
    with pytest.raises(VersionConflict) as raised:
        repo.record_policy_version(PolicyVersionRecord(job.id, 3))
    assert (raised.value.version, raised.value.latest) == (3, 5)


def test_parent_must_be_a_recorded_earlier_version(repo: Repository) -> None:
    job = running_job(repo, versions=2)
    with pytest.raises(VersionNotFound, match="has no policy version 7"):
        repo.record_policy_version(PolicyVersionRecord(job.id, 9, parent_version=7))
    with pytest.raises(InvalidValue, match="parent_version: 3 is not below version 3"):
        repo.record_policy_version(PolicyVersionRecord(job.id, 3, parent_version=3))
    assert repo.latest_version(job.id).version == 1


@pytest.mark.parametrize(
    ("record", "match"),
    [
        (PolicyVersionRecord(0, -1), "version: -1 is negative"),
        (PolicyVersionRecord(0, 1, metrics=PolicyMetrics(loss=float("nan"))), "metrics.loss"),
        (PolicyVersionRecord(0, 1, metrics=PolicyMetrics(kl=float("inf"))), "metrics.kl"),
        (PolicyVersionRecord(0, 1, metrics=PolicyMetrics(num_rejected=-2)), "num_rejected"),
        (
            PolicyVersionRecord(0, 1, metrics=PolicyMetrics(extra={"x": float("nan")})),
            "metrics.extra",
        ),
    ],
)
def test_invalid_versions_are_refused(repo: Repository, record, match: str) -> None:
    job = running_job(repo, versions=1)
    with pytest.raises(InvalidValue, match=match):
        repo.record_policy_version(
            PolicyVersionRecord(job.id, record.version, metrics=record.metrics)
        )
    assert [v.version for v in repo.list_versions(job.id)] == [0]


def test_versions_of_unknown_or_finished_jobs_are_refused(repo: Repository) -> None:
    with pytest.raises(JobNotFound):
        repo.record_policy_version(PolicyVersionRecord(12345, 0))
    job = running_job(repo, versions=1)
    repo.mark_succeeded(job.id)
    with pytest.raises(InvalidTransition, match="cannot record a policy version"):
        repo.record_policy_version(PolicyVersionRecord(job.id, 1))


def test_version_metrics_combine_recorded_metrics_and_samples(repo: Repository) -> None:
    job = running_job(repo, versions=1)
    repo.record_policy_version(
        PolicyVersionRecord(job.id, 1, parent_version=0, metrics=PolicyMetrics(loss=0.5))
    )
    repo.record_batch(
        make_batch(
            job.id,
            [make_sample(0, 0, reward=1.0, tokens=2), make_sample(0, 1, reward=0.0, tokens=4)],
        )
    )
    truncated = make_sample(1, 0, version=1, finish_reason="length", reward=0.5, tokens=8)
    errored = make_sample(
        1, 1, version=1, finish_reason="error", error_code="internal", reward=None, tokens=0
    )
    repo.record_batch(
        make_batch(
            job.id, [truncated, errored], version=1, step=1, status="rejected", reasons=("x",)
        )
    )
    v0, v1 = repo.version_metrics(job.id)
    assert v0.version == 0 and v0.recorded.metrics.loss is None
    assert (v0.num_samples, v0.num_accepted_batches, v0.num_rejected_batches) == (2, 1, 0)
    assert v0.sample_reward_mean == 0.5
    assert v0.mean_response_length == 3.0
    assert v0.finish_reasons == {FinishReason.STOP: 2}
    assert v1.recorded.metrics.loss == 0.5
    assert (v1.num_samples, v1.num_accepted_batches, v1.num_rejected_batches) == (2, 0, 1)
    assert v1.sample_reward_mean == 0.5  # the errored sample has no reward
    assert v1.mean_response_length == 4.0
    assert v1.finish_reasons == {FinishReason.LENGTH: 1, FinishReason.ERROR: 1}


def test_version_metrics_of_versions_trained_elsewhere(repo: Repository) -> None:
    """An evaluation job stores samples of a version it did not record itself."""
    job = repo.create_job("evaluate", {"source_job": 1, "version": 40})
    repo.mark_running(job.id)
    repo.record_batch(make_batch(job.id, [make_sample(0, 0, version=40)], version=40))
    (metrics,) = repo.version_metrics(job.id)
    assert (metrics.version, metrics.recorded, metrics.num_samples) == (40, None, 1)


def test_version_metrics_match_a_recount_of_the_samples(repo: Repository) -> None:
    """The running totals add up across batches, including batches mixing versions."""
    job = running_job(repo, versions=3)
    batches = [
        (0, [make_sample(0, g, reward=g / 4, tokens=g + 1) for g in range(4)]),
        (1, [make_sample(1, g, version=g % 2, reward=1.0, tokens=3) for g in range(4)]),
        (2, [make_sample(2, 0, version=1, finish_reason="length", reward=0.25, tokens=9)]),
        (2, [make_sample(3, g, version=2, reward=0.5, tokens=2) for g in range(3)]),
    ]
    for version, samples in batches:
        repo.record_batch(make_batch(job.id, samples, version=version))
    stored = repo.list_samples(SampleFilter(job.id), limit=100).items
    for metrics in repo.version_metrics(job.id):
        mine = [s for s in stored if s.policy_version == metrics.version]
        assert metrics.num_samples == len(mine)
        assert metrics.sample_reward_mean == pytest.approx(sum(s.reward for s in mine) / len(mine))
        assert metrics.mean_response_length == sum(s.response_length for s in mine) / len(mine)
        assert metrics.finish_reasons == Counter(s.finish_reason for s in mine)
    assert [m.num_accepted_batches for m in repo.version_metrics(job.id)] == [1, 1, 2]
