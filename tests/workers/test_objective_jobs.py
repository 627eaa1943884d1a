"""The objective's settings from a job file (issue 40): TRL's names stored as ours, bad names
and combinations refused at submission with the reason, and a job's recorded step metrics:
TRL's clip shares and the learning rate under its schedule, which a cancelled and resumed
job continues exactly."""

import math

import pytest

from tests.workers.helpers import train_config
from workers import api
from workers.jobs import run_job
from workers.specs import SpecError


def test_a_job_in_trls_names_is_stored_in_ours(env, repo, tiny_model):
    config = train_config(tiny_model, num_generations=2, beta=0.0, epsilon_high=0.28)
    del config["group_size"]
    job = api.submit_job("train", config)
    stored = repo.get_job(job.id).config
    assert (stored["group_size"], stored["kl_coef"], stored["clip_eps_high"]) == (2, 0.0, 0.28)
    assert not {"num_generations", "beta", "epsilon_high"} & set(stored)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"gradient_accumulation_steps": 4}, "'gradient_accumulation_steps' \\(TRL\\) has no"),
        ({"loss_type": "vespo"}, "loss_type must be one of"),
        ({"policy_loss": "cispo"}, "set it"),
        ({"advantage": "rloo", "scale_rewards": "none"}, "belong to advantage 'grpo'"),
        ({"entropy_coef": -1.0}, "entropy_coef must be >= 0"),
    ],
)
def test_bad_objectives_are_refused_at_submission(env, repo, tiny_model, overrides, problem):
    with pytest.raises(SpecError, match=problem):
        api.submit_job("train", train_config(tiny_model, **overrides))
    assert repo.list_jobs() == []


def cosine(step, warmup, total):
    """transformers' `_get_cosine_schedule_with_warmup_lr_lambda`, as written there."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def test_step_metrics_and_the_schedule_survive_a_cancel_and_resume(repo, settings, tiny_model):
    values = train_config(
        tiny_model,
        steps=6,
        lr=1e-3,
        lr_scheduler_type="cosine",
        warmup_ratio=0.34,  # ceil(0.34 * 6) = 3 warm-up steps
        clip_eps_high=0.28,
        loss_type="grpo",
    )
    job = repo.create_job("train", values, total_steps=6)

    def cancel_at_step_4(meta):
        if meta["step"] == 4:
            repo.request_cancel(job.id)

    assert run_job(repo, job.id, settings, progress=cancel_at_step_4).status == "cancelled"
    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "succeeded"
    versions = repo.list_versions(job.id)[1:]
    assert [v.version for v in versions] == [1, 2, 3, 4, 5, 6]
    rates = [v.metrics.extra["learning_rate"] for v in versions]
    assert rates == pytest.approx([1e-3 * cosine(s, 3, 6) for s in range(6)], abs=1e-15)
    for v in versions:
        assert {"clip_ratio/low_mean", "clip_ratio/high_mean"} <= set(v.metrics.extra)
