"""Job sizes and the files a job names are checked at submission and again on the worker."""

import dataclasses
import os
import re
import shutil
import tracemalloc

import pytest

from db import JobStatus
from tests.core_engine.test_user_files import HANG_GUARD_S, within
from tests.workers.helpers import train_config
from workers import api
from workers.jobs import run_job
from workers.sizes import host_memory_bytes
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


def test_a_refused_data_file_names_the_allowed_roots_and_how_to_add_one(
    env, settings, tmp_path, monkeypatch
):
    outside = tmp_path / "elsewhere" / "prompts.jsonl"
    outside.parent.mkdir()
    outside.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    monkeypatch.setenv("RLWB_MODEL_ROOTS", f"{tmp_path / 'models'}:{tmp_path / 'more'}")
    config = {k: v for k, v in train_config("demo").items() if k != "task"}
    with pytest.raises(SpecError) as refused:
        api.submit_job("train", {**config, "data": str(outside)})
    message = str(refused.value)
    for root in (tmp_path / "models", tmp_path / "more", settings.data_dir):
        assert str(root) in message
    assert "set RLWB_MODEL_ROOTS" in message


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


# Issue 24, item 3: every numeric field has a type and a range; int fields refuse floats,
# NaN and infinities, and the sizes' product meets the footprint rule.
@pytest.mark.parametrize(
    ("kind", "change", "problem"),
    [
        ("train", {"steps": 1e300}, "steps must be a whole number, got 1e+300"),
        ("train", {"steps": float("nan")}, "steps must be a whole number, got nan"),
        ("train", {"steps": float("inf")}, "steps must be a whole number, got inf"),
        ("train", {"batch_size": 2.0}, "batch_size must be a whole number, got 2.0"),
        ("train", {"group_size": True}, "group_size must be a whole number, got True"),
        ("train", {"steps": 10**300}, "steps must be <= 1,000,000,000"),
        ("train", {"lr": float("nan")}, "lr must be a finite number, got nan"),
        ("train", {"lr": float("inf")}, "lr must be a finite number, got inf"),
        ("train", {"kl_coef": -1.0}, "kl_coef must be >= 0"),
        ("train", {"max_grad_norm": 0}, "max_grad_norm must be > 0"),
        ("train", {"kv_cache_bytes": 1e300}, "kv_cache_bytes must be a whole number"),
        ("train", {"engine_batch_size": 2**40}, "engine_batch_size must be <= 65,536"),
        ("train", {"gradient_checkpointing": "no"}, "gradient_checkpointing must be true or"),
        ("train", {"heldout_prompts": 1e300}, "heldout_prompts must be a whole number"),
        ("evaluate", {"num_prompts": 1e300}, "num_prompts must be a whole number"),
        ("evaluate", {"version": float("nan")}, "version must be a whole number"),
        ("compare", {"versions": [0, 1.5]}, "versions must be a whole number, got 1.5"),
    ],
)
def test_numbers_have_a_type_and_a_range(env, tiny_model, kind, change, problem):
    config = {
        "train": train_config(tiny_model),
        "evaluate": {"job_id": 1, "version": 0, "task": "always7"},
        "compare": {"job_id": 1, "versions": [0, 1], "task": "always7"},
    }[kind]
    with pytest.raises(SpecError, match=re.escape(problem)):
        api.validate_job(kind, {**config, **change})


def test_every_numeric_trainer_field_has_a_row_in_the_table():
    from core_engine.rl.config import GRPOConfig
    from core_engine.rl.limits import TRAINER_FIELDS

    numeric = {
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if re.fullmatch(r"(int|float|bool)( \| None)?", str(f.type))
    }
    assert numeric and numeric <= set(TRAINER_FIELDS)


def test_four_million_samples_per_step_are_refused_by_the_footprint_rule(
    env, tiny_model, monkeypatch
):
    """The form's old ceiling: 65,536 prompts x 64 samples x 1 token = 4,194,304 tokens, just
    within the tokens-per-step limit, but ~21 GiB of rollouts at the least."""
    monkeypatch.setenv("RLWB_HOST_MEMORY", str(16 * 2**30))
    config = train_config(tiny_model, batch_size=65_536, group_size=64, max_tokens=1)
    with pytest.raises(SpecError) as info:
        api.validate_job("train", config)
    message = str(info.value)
    assert "footprint: one step's rollouts need at least 20.9 GiB" in message
    assert "4,194,304 samples" in message and "16.0 GiB a worker holds" in message
    assert "tokens per step" not in message
    monkeypatch.delenv("RLWB_HOST_MEMORY")
    assert host_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    api.validate_job("train", train_config(tiny_model, batch_size=64, group_size=16))


def test_a_job_file_with_a_float_step_count_is_refused(env, repo, tmp_path, capsys):
    from workers.commands import main

    job_file = tmp_path / "job.toml"
    job_file.write_text('model = "demo"\ntask = "always7"\nsteps = 1e300\n')
    assert main(["submit", str(job_file)]) == 1
    assert "steps must be a whole number, got 1e+300" in capsys.readouterr().out
    os.unlink(job_file)
    os.mkfifo(job_file)
    assert within(HANG_GUARD_S, lambda: main(["submit", str(job_file)])) == 1  # never opened
    assert "is a FIFO, not a regular file" in capsys.readouterr().out
    assert repo.list_jobs() == []


def test_the_worker_refuses_a_hand_made_row_with_a_float_step_count(
    repo, settings, tiny_model, monkeypatch
):
    """Refused before the training starts (which would run for ever): the trainer is never
    called."""
    from workers import training
    from workers.control import Outcome

    trained = []

    def run_training(repo, job, *_):
        trained.append(job.id)
        return Outcome("failed", "the training ran")

    monkeypatch.setattr(training, "run_training", run_training)
    job = repo.create_job("train", train_config(tiny_model, steps=1e300), total_steps=None)
    assert run_job(repo, job.id, settings, queued=True).status == "failed"
    assert "steps must be a whole number, got 1e+300" in repo.get_job(job.id).error
    assert trained == []


# Issue 24, item 7: a FIFO or a huge sparse file under a model root or the data directory is
# refused from its stat, unread, by the API and by the worker.
def test_special_files_are_refused_unread_by_the_api(env, repo, tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "generation_config.json").unlink(missing_ok=True)
    os.mkfifo(model / "generation_config.json")
    data = env / "prompts.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(data)
    huge = env / "huge.jsonl"
    huge.touch()
    os.truncate(huge, 4 * 2**30)
    for change, problem in (
        ({"model": str(model)}, "generation_config.json is a FIFO, not a regular file"),
        ({"task": None, "data": str(data)}, "prompts.jsonl is a FIFO, not a regular file"),
        ({"task": None, "data": str(huge)}, "huge.jsonl is 4,096.0 MiB, over the 256.0 MiB"),
    ):
        config = {k: v for k, v in {**train_config(tiny_model), **change}.items() if v is not None}
        tracemalloc.start()
        with pytest.raises(SpecError, match=re.escape(problem)):
            within(HANG_GUARD_S, lambda c=config: api.submit_job("train", c))  # FIFOs unopened
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 * 2**20, peak  # nothing of the 4 GiB file was read
    assert repo.list_jobs() == []
