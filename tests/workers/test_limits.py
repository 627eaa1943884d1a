"""Job sizes and the files a job names are checked at submission and again on the worker."""

import pytest

from db import JobStatus
from tests.workers.helpers import train_config
from workers import api
from workers.jobs import run_job
from workers.specs import SpecError


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"batch_size": 4096, "group_size": 64, "max_tokens": 64}, "tokens per step"),
        ({"steps": 10**9}, "steps >"),
        ({"max_tokens": 10**6}, "max_tokens"),
    ],
)
def test_oversized_jobs_are_refused(env, tiny_model, change, problem):
    with pytest.raises(SpecError, match=problem):
        api.validate_job("train", train_config(tiny_model, **change))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"model": "/etc"}, "not under a model root"),
        ({"task": None, "data": "/etc/passwd"}, "not under a model root or the data dir"),
        ({"output_dir": "/etc/rlwb"}, "output_dir"),
    ],
)
def test_files_outside_the_roots_are_refused_by_the_api(env, repo, tiny_model, change, problem):
    config = {k: v for k, v in {**train_config(tiny_model), **change}.items() if v is not None}
    with pytest.raises(SpecError, match=problem):
        api.submit_job("train", config)
    assert repo.list_jobs() == []


def test_the_worker_checks_again(repo, settings, tiny_model, monkeypatch):
    """A job row written past the API (or before the operator narrowed the roots)."""
    job = repo.create_job("train", train_config(tiny_model, max_tokens=64), total_steps=3)
    monkeypatch.setenv("RLWB_MAX_NEW_TOKENS", "32")
    assert run_job(repo, job.id, settings, queued=True).status == "failed"
    assert "max_tokens 64 > 32" in repo.get_job(job.id).error
    monkeypatch.delenv("RLWB_MAX_NEW_TOKENS")
    other = repo.create_job("train", train_config(tiny_model), total_steps=3)
    monkeypatch.setenv("RLWB_MODEL_ROOTS", str(settings.data_dir))
    assert run_job(repo, other.id, settings, queued=True).status == "failed"
    info = repo.get_job(other.id)
    assert info.status is JobStatus.FAILED and "not under a model root" in info.error


def test_a_kv_budget_below_one_request_is_refused_before_queueing(env, repo, tiny_model):
    import torch
    from transformers import AutoConfig

    from core_engine.cache.sizing import model_kv_bytes_per_token

    per_token = model_kv_bytes_per_token(AutoConfig.from_pretrained(tiny_model), torch.bfloat16)
    config = train_config(tiny_model, max_tokens=8)
    floor = per_token * 9  # one prompt token + max_tokens
    with pytest.raises(SpecError, match=f"cannot hold one request: 9 tokens .* need {floor:,}"):
        api.submit_job("train", {**config, "kv_cache_bytes": floor - 1})
    assert repo.list_jobs() == []
    api.submit_job("train", {**config, "kv_cache_bytes": floor})  # the worker decides exactly
    assert len(repo.list_jobs()) == 1
