"""The engine's own entry points as the docs use them (docs/jobs.md, docs/engine.md): the
shipped policies by name, and the trainer alone without ``output_dir``."""

import json

import uvicorn

import core_engine.engine
import core_engine.network.__main__ as server
import core_engine.network.app
from core_engine.assets import CALCULATOR_POLICY, SHIPPED_POLICY
from core_engine.rl import cli


def test_the_trainer_alone_takes_demo_and_defaults_its_output_dir(tmp_path, capsys):
    job_file = tmp_path / "job.json"
    job = {"model": "demo", "task": "addition", "steps": 1, "batch_size": 2, "group_size": 2}
    job_file.write_text(json.dumps({**job, "max_tokens": 4}))

    assert cli.main(["train", str(job_file)]) == 0

    output = tmp_path / "job-checkpoints"
    assert f"checkpoints in {output}" in capsys.readouterr().out
    assert any((path / "config.json").is_file() for path in output.iterdir())


def test_the_server_serves_a_shipped_policy_by_name(monkeypatch):
    loaded, served = [], []
    # imported by main once the arguments are parsed
    monkeypatch.setattr(
        core_engine.engine, "load_engine", lambda model, *a, **k: loaded.append(model)
    )
    monkeypatch.setattr(core_engine.network.app, "create_app", lambda engine, name, **k: name)
    monkeypatch.setattr(uvicorn, "run", lambda app, **k: served.append(app))
    server.main(["--model", "demo"])
    server.main(["--model", "calculator-demo"])
    assert loaded == [str(SHIPPED_POLICY), str(CALCULATOR_POLICY)]
    assert served == ["demo", "calculator-demo"]  # the API's model id is the name given


def test_the_trainer_alone_says_what_is_wrong_with_a_job_file(tmp_path, capsys):
    """A worker's key (system_prompt) or a wrong task is a line naming the file and the
    fix, and exit status 2, not a traceback (issue 43)."""
    job_file = tmp_path / "job.toml"
    job_file.write_text('model = "demo"\ntask = "addition"\nsystem_prompt = "Be brief."\n')
    assert cli.main(["train", str(job_file)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"{job_file}: unknown config keys: ['system_prompt']")
    assert "`rlwb train JOB_FILE`" in said
    job_file.write_text('model = "demo"\ntask = "nope"\n')
    assert cli.main(["train", str(job_file)]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err
