"""A job file's ``pipeline`` is checked with the trainer's rules when it is submitted: a refusal
names the field; and the size checks (`workers.sizes`) still refuse what is too large."""

import argparse

import pytest

from workers.commands import run_queue_command
from workers.specs import SpecError, check_sizes
from workers.submission import validate_job

JOB = 'model = "demo"\ntask = "always7"\nsteps = 2\n'


def _submit(tmp_path, lines: str) -> int:
    path = tmp_path / "job.toml"
    path.write_text(JOB + lines)
    return run_queue_command(argparse.Namespace(command="submit", kind="train", config=path))


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ('pipeline = "bogus"\n', "pipeline must be one of sync, one_step, in_flight, got 'bogus'"),
        (
            'pipeline = "one_step"\nmax_policy_lag = 1\nupdates_per_batch = 2\n',
            "pipeline 'one_step' needs updates_per_batch = 1",
        ),
        ('pipeline = "in_flight"\n', "max_policy_lag must be at least 1"),
    ],
)
def test_a_job_file_with_an_unusable_pipeline_is_refused_with_the_field_named(
    tmp_path, capsys, lines, problem
):
    assert _submit(tmp_path, lines) == 1
    out = capsys.readouterr().out
    assert out.startswith("refused: invalid training config:") and problem in out


@pytest.mark.parametrize("mode", ["sync", "one_step", "in_flight"])
def test_every_pipeline_mode_is_accepted_with_a_lag_of_one(mode):
    config = {"model": "demo", "task": "always7", "steps": 2, "pipeline": mode}
    assert validate_job("train", {**config, "max_policy_lag": 1}) == 2


def test_the_size_limits_still_refuse_what_is_too_large(monkeypatch):
    config = {"model": "demo", "task": "always7", "steps": 5, "max_tokens": 64}
    monkeypatch.setenv("RLWB_MAX_NEW_TOKENS", "32")
    monkeypatch.setenv("RLWB_MAX_STEPS", "4")
    with pytest.raises(SpecError, match=r"too large.*max_tokens 64 > 32; steps > 4"):
        check_sizes("train", config)
    evaluation = {"model": "demo", "task": "always7", "num_prompts": 9, "max_tokens": 64}
    monkeypatch.setenv("RLWB_MAX_EVAL_PROMPTS", "8")
    with pytest.raises(SpecError, match=r"max_tokens 64 > 32; num_prompts > 8"):
        check_sizes("evaluate", evaluation)
    monkeypatch.setenv("RLWB_HOST_MEMORY", "1024")
    with pytest.raises(SpecError, match="footprint: one step's rollouts need at least"):
        check_sizes("evaluate", {**evaluation, "max_tokens": 8, "num_prompts": 4})
