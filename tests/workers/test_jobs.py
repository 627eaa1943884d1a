"""Job glue without Celery: `run_job` on a temp SQLite database with the tiny model."""

import pytest

from db import BatchStatus, JobStatus, SampleFilter
from tests.workers.helpers import train_config
from workers.jobs import Stop, run_job
from workers.training import LOADING_PHASE


def test_train_job_records_every_batch_and_version(repo, settings, tiny_model):
    job = repo.create_job("train", train_config(tiny_model), total_steps=3)
    pings = []

    outcome = run_job(repo, job.id, settings, progress=pings.append)

    assert outcome.status == "succeeded"
    info = repo.get_job(job.id)
    assert (info.status, info.step, info.total_steps, info.current_version) == (
        JobStatus.SUCCEEDED,
        3,
        3,
        3,
    )
    assert info.attempts == 1
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == [0, 1, 2, 3]
    assert [v.parent_version for v in versions] == [None, 0, 1, 2]
    assert versions[0].checkpoint_path == tiny_model
    for v in versions[1:]:
        assert v.checkpoint_path == str(
            settings.jobs_dir / str(job.id) / f"version-{v.version:05d}"
        )
        assert len(v.weights_checksum) == 64
        m = v.metrics
        assert m.num_accepted == 1 and m.num_rejected == 0
        assert m.reward_mean == 0.0 and m.loss is not None and m.kl is not None
        assert m.train_infer_mismatch is not None and m.tokens_per_second > 0
    batches = repo.list_batches(job.id)
    assert [(b.step, b.policy_version, b.status, b.num_samples) for b in batches] == [
        (s, s, BatchStatus.ACCEPTED, 4) for s in range(3)
    ]
    assert pings[0] == {**pings[0], "step": 0, "phase": LOADING_PHASE}  # before the steps
    assert [p["step"] for p in pings[1:]] == [0, 1, 2, 3]
    assert not any("phase" in p for p in pings[1:])


def test_samples_carry_everything_the_ui_shows(repo, settings, tiny_model):
    job = repo.create_job("train", train_config(tiny_model, steps=1), total_steps=1)
    run_job(repo, job.id, settings)

    page = repo.list_samples(SampleFilter(job_id=job.id))
    assert [(s.prompt_index, s.group_index) for s in page.items] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    sample = repo.get_sample(page.items[0].id)
    assert sample.policy_version == 0
    assert sample.prompt_text.endswith("<|assistant|>") and "?" in sample.prompt_text
    assert sample.prompt_messages[0]["role"] == "user"
    assert sample.reference_output == "7"
    assert len(sample.response_token_ids) == len(sample.behaviour_logprobs) == 4
    assert len(sample.temperature_logprobs) == 4
    assert sample.finish_reason == "length" and sample.error_code is None
    assert sample.reward == 0.0 and sample.advantage == 0.0
    assert sample.seed is not None and sample.cached_prompt_tokens >= 0
    assert sample.rank == 0  # a one-device job: every sample is rank 0's (issue 31)


def test_cancel_is_cooperative_and_keeps_what_was_done(repo, settings, tiny_model):
    job = repo.create_job("train", train_config(tiny_model, steps=50), total_steps=50)

    def cancel_at_step_2(meta):
        if meta["step"] == 2:
            repo.request_cancel(job.id)

    outcome = run_job(repo, job.id, settings, progress=cancel_at_step_2)

    assert outcome.status == "cancelled"
    info = repo.get_job(job.id)
    assert info.status is JobStatus.CANCELLED and info.step == 2
    assert [v.version for v in repo.list_versions(job.id)] == [0, 1, 2]
    assert len(repo.list_batches(job.id)) == 2


def test_finished_and_foreign_jobs_are_left_alone(repo, settings, tiny_model):
    done = repo.create_job("train", train_config(tiny_model))
    repo.request_cancel(done.id)  # queued: cancelled at once
    assert run_job(repo, done.id, settings).status == "cancelled"
    assert repo.get_job(done.id).attempts == 0

    owned = repo.create_job("train", train_config(tiny_model))
    repo.set_celery_task_id(owned.id, "new-task")
    outcome = run_job(repo, owned.id, settings, task_id="old-task")
    assert (outcome.status, outcome.stop) == ("interrupted", Stop.LOST)
    assert repo.get_job(owned.id).status is JobStatus.QUEUED


def test_a_job_that_keeps_losing_its_worker_fails_after_max_attempts(repo, settings, tiny_model):
    job = repo.create_job("train", train_config(tiny_model))
    for _ in range(settings.max_attempts):
        repo.start_attempt(job.id)  # earlier starts whose worker died

    outcome = run_job(repo, job.id, settings)

    assert outcome.status == "failed"
    info = repo.get_job(job.id)
    assert info.status is JobStatus.FAILED
    assert f"gave up after {settings.max_attempts} attempts" in info.error


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"task": "no-such-task"}, "unknown task"),
        ({"model": "/nonexistent/model"}, "Error"),
    ],
)
def test_a_job_that_cannot_run_fails_with_its_reason(
    repo, settings, tiny_model, overrides, expected
):
    job = repo.create_job("train", {**train_config(tiny_model), **overrides})
    assert run_job(repo, job.id, settings).status == "failed"
    info = repo.get_job(job.id)
    assert info.status is JobStatus.FAILED and expected in info.error


def test_a_reward_without_variance_from_the_first_batch_ends_the_job_stalled(
    repo, settings, tiny_model
):
    """A random model never answers "7": every sample scores 0.0, nothing can be learnt. The
    job ends `stalled` (not a crash) with the reason, and can be resumed like a failed one."""
    config = train_config(tiny_model, steps=20, drop_zero_variance_groups=True)
    job = repo.create_job("train", {**config, "max_consecutive_rejections": 2}, total_steps=20)

    assert run_job(repo, job.id, settings).status == "stalled"
    info = repo.get_job(job.id)
    batches = repo.list_batches(job.id)
    rewards = {s.reward for s in repo.list_samples(SampleFilter(job.id), limit=1000).items}
    assert rewards == {0.0} and len(batches) == 3
    assert info.status is JobStatus.STALLED and info.current_version == 0
    assert info.error == "every sample scored 0.0 in 3 batches: check the reward and the task"
    assert all(b.status is BatchStatus.REJECTED and b.rejection_reasons for b in batches)
    assert repo.reopen(job.id).status is JobStatus.QUEUED


def test_the_stall_reason_says_what_the_rewards_were():
    from workers.training import stall_reason

    assert stall_reason([[1.0, 1.0], [1.0, 1.0]], 40) == (
        "every sample scored 1.0 in 2 batches since version 40: nothing left to learn from"
    )
    assert stall_reason([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]], 0) == (
        "no group's rewards varied in 3 batches (scores from 0.0 to 1.0): "
        "check the reward and the task"
    )


def test_evaluate_and_compare_store_samples_of_the_evaluated_versions(repo, settings, tiny_model):
    train = repo.create_job("train", train_config(tiny_model, steps=2, lr=0.05))
    run_job(repo, train.id, settings)
    versions = repo.list_versions(train.id)

    evaluate = repo.create_job(
        "evaluate", {"job_id": train.id, "version": 2, "task": "always7", "num_prompts": 3}
    )
    assert run_job(repo, evaluate.id, settings).status == "succeeded"
    [recorded] = repo.list_versions(evaluate.id)
    assert recorded.version == 2 and recorded.weights_checksum == versions[2].weights_checksum
    assert recorded.metrics.reward_mean == 0.0
    page = repo.list_samples(SampleFilter(job_id=evaluate.id))
    assert len(page.items) == 3 and {s.policy_version for s in page.items} == {2}

    compare = repo.create_job(
        "compare",
        {"job_id": train.id, "versions": [2, 0], "task": "always7", "num_prompts": 3, "seed": 5},
    )
    assert run_job(repo, compare.id, settings).status == "succeeded"
    assert repo.get_job(compare.id).step == 2
    pairs = repo.compare_versions(compare.id, 0, 2)
    assert len(pairs) == 3
    for pair in pairs:
        assert len(pair.samples_a) == len(pair.samples_b) == 1
    seeds = {
        v: [
            repo.get_sample(s.id).seed
            for s in repo.list_samples(
                SampleFilter(job_id=compare.id, min_version=v, max_version=v)
            ).items
        ]
        for v in (0, 2)
    }
    assert seeds[0] == seeds[2]


def test_evaluate_refuses_a_checkpoint_that_does_not_match_its_checksum(
    repo, settings, tiny_model, tmp_path
):
    from core_engine.toy import save_tiny_checkpoint

    train = repo.create_job("train", train_config(tiny_model, steps=1))
    run_job(repo, train.id, settings)
    checkpoint = repo.list_versions(train.id)[1].checkpoint_path
    save_tiny_checkpoint(checkpoint, arch="llama", seed=1)  # overwritten behind our back

    job = repo.create_job("evaluate", {"job_id": train.id, "version": 1, "task": "always7"})
    assert run_job(repo, job.id, settings).status == "failed"
    assert "does not match its recorded checksum" in repo.get_job(job.id).error


@pytest.mark.parametrize("pipeline", ["one_step", "in_flight"])
def test_a_pipelined_job_stamps_each_sample_with_its_oldest_token(
    repo, settings, tiny_model, pipeline
):
    """Batches after the first are generated one version ahead of the step that trains them:
    the batch row carries the trainer's version, each sample the version that produced it (its
    oldest token's), and the version's metrics say how old the trained tokens were."""
    config = train_config(tiny_model, steps=4, pipeline=pipeline, max_policy_lag=1)
    job = repo.create_job("train", config, total_steps=4)
    assert run_job(repo, job.id, settings).status == "succeeded"
    batches = repo.list_batches(job.id)
    assert [b.policy_version for b in batches] == [0, 1, 2, 3]
    for batch in batches:
        for sample in repo.list_samples(SampleFilter(job_id=job.id, batch_id=batch.id)).items:
            detail = repo.get_sample(sample.id)
            assert 0 <= batch.policy_version - detail.policy_version <= 1
            assert all(0 <= batch.policy_version - v <= 1 for v, _ in detail.version_runs)
    versions = repo.list_versions(job.id)[1:]
    assert versions[0].metrics.extra["policy_lag_max"] == 0  # the first batch: generated first
    lags = [v.metrics.extra["policy_lag_max"] for v in versions[1:]]
    # in flight, a batch whose first token came after the update is trained at lag 0 (timing)
    assert all(lag == 1 for lag in lags) if pipeline == "one_step" else set(lags) <= {0, 1}
    assert all(
        v.metrics.extra["is_weight_max"] > 0
        for v in versions[1:]
        if v.metrics.extra["policy_lag_max"] == 1
    )
