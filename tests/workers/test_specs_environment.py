"""A train job's ``environment`` is refused when it is submitted unless registered, with the
registry's message naming the registered ones; a built-in or operator-registered one passes."""

import argparse

import pytest

from workers.commands import run_queue_command
from workers.job_files import check_data_records
from workers.specs import SpecError
from workers.submission import validate_job

JOB = {"model": "demo", "task": "always7", "steps": 2, "output_dir": "unused"}


def test_a_job_file_naming_an_unregistered_environment_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLWB_ENVIRONMENTS", raising=False)
    path = tmp_path / "job.toml"
    path.write_text('model = "demo"\ntask = "always7"\nsteps = 2\nenvironment = "chess"\n')
    command = argparse.Namespace(command="submit", kind="train", config=path)
    assert run_queue_command(command) == 1
    out = capsys.readouterr().out
    assert out.startswith("refused: ")
    assert "unknown environment 'chess': not registered" in out
    assert "(registered: calculator, guess_number;" in out


@pytest.mark.parametrize("name", ["calculator", "guess_number", "mine"])
def test_registered_environments_pass(monkeypatch, name):
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "mine=my_envs:Factory")  # read, never imported
    assert validate_job("train", {**JOB, "environment": name}) == 2


@pytest.mark.parametrize("name", ["", "Calculator", 7, ["calculator"]])
def test_anything_else_is_refused(monkeypatch, name):
    monkeypatch.delenv("RLWB_ENVIRONMENTS", raising=False)
    with pytest.raises(SpecError, match="unknown environment"):
        validate_job("train", {**JOB, "environment": name})


def test_episodes_longer_than_the_models_context_are_refused_at_submission():
    """The calculator policy's context is 384 tokens: the default `max_episode_tokens` (512)
    cannot fit, and the refusal names both and the bound; 384 passes."""
    job = {**JOB, "model": "calculator-demo", "task": "word_problems"}
    with pytest.raises(SpecError, match=r"max_episode_tokens \(512\) exceeds the model's 384"):
        check_data_records({**job, "environment": "calculator"})
    check_data_records({**job, "environment": "calculator", "max_episode_tokens": 384})
