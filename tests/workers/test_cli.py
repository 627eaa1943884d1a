"""The ``rlwb`` command (`ui.cli`): help everywhere, db upgrade, train without the queue, ui,
and ``up`` on embedded defaults (no broker server, SQLite) end to end."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

import ui.app
from db import JobStatus
from tests.workers.helpers import running, train_config, wait_for
from ui import cli
from workers.commands import worker_argv

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = (
    "import json, sys; from workers.api import submit_job;"
    "print(submit_job('train', json.loads(sys.argv[1])).id)"
)


@pytest.mark.parametrize(
    "command", [[], ["up"], ["worker"], ["ui"], ["db"], ["db", "upgrade"], ["train"]]
)
def test_help_everywhere(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: rlwb" in capsys.readouterr().out


def test_db_upgrade_creates_the_tables(env):
    url = os.environ["DATABASE_URL"]
    Path(url.removeprefix("sqlite:///")).unlink()
    assert cli.main(["db", "upgrade"]) == 0
    assert "jobs" in sa.inspect(sa.create_engine(url)).get_table_names()


def test_train_runs_a_job_here_and_records_it(env, repo, tiny_model, tmp_path, capsys):
    config = tmp_path / "job.json"
    config.write_text(json.dumps(train_config(tiny_model, steps=2)))

    assert cli.main(["train", str(config)]) == 0

    out = capsys.readouterr().out
    assert "step 2/2  version 2  accepted" in out and "succeeded" in out
    [job] = repo.list_jobs()
    assert job.status is JobStatus.SUCCEEDED and job.current_version == 2


@pytest.fixture
def served(monkeypatch):
    """What `rlwb ui` would serve (nothing is served), after migrating (not done here)."""
    calls = []
    monkeypatch.setattr(ui.app, "launch", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cli, "upgrade", lambda: calls.append("upgrade"))
    return calls


def test_ui_migrates_then_serves_the_ui(served):
    assert cli.main(["ui", "--port", "9999", "--auth", "ann:secret"]) == 0
    assert served == [
        "upgrade",
        {
            "host": "127.0.0.1",
            "port": 9999,
            "auth": ("ann", "secret"),
            "share": False,
            "allow_unauthenticated": False,
        },
    ]


def test_a_public_address_needs_a_password(served, monkeypatch, capsys):
    """Also the image's default command: it serves nothing public without RLWB_AUTH."""
    monkeypatch.delenv("RLWB_AUTH", raising=False)
    cmd = next(
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line[:4] == "CMD "
    )
    for argv in (["ui", "--host", "0.0.0.0"], json.loads(cmd.removeprefix("CMD "))):
        assert cli.main(argv) == 2
        assert "without a password" in capsys.readouterr().err
    assert served == []
    assert cli.main(["ui", "--host", "0.0.0.0", "--auth", "ann:secret"]) == 0
    assert cli.main(["ui", "--host", "0.0.0.0", "--allow-unauthenticated"]) == 0
    monkeypatch.setenv("RLWB_AUTH", "ann:secret")
    assert cli.main(["ui", "--host", "0.0.0.0"]) == 0
    assert [call["host"] for call in served if call != "upgrade"] == ["0.0.0.0"] * 3


def test_worker_arguments():
    argv = worker_argv(["-n", "gpu0@%h"])
    assert argv[:4] == ["worker", "--pool=threads", "--concurrency=1", "--queues=gpu"]
    chat = worker_argv([], interactive=True)
    assert chat[:4] == ["worker", "--pool=threads", "--concurrency=2", "--queues=interactive"]
    assert argv[-2:] == ["-n", "gpu0@%h"]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_up_runs_a_submitted_job_on_embedded_defaults(tmp_path, tiny_model):
    """``rlwb up`` with nothing configured: SQLite in the data dir, the filesystem broker, a
    worker child process. A job submitted through the API runs; SIGTERM stops everything."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RLWB_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["RLWB_MODEL_ROOTS"] = tempfile.gettempdir()  # where the tests' models are
    log = tmp_path / "up.log"
    argv = [sys.executable, "-m", "ui", "up", "--no-ui"]
    with running(argv, env, tmp_path, log) as up:
        wait_for(lambda: "ready" in log.read_text(), 60, "the worker to start")
        job_id = subprocess.run(
            [sys.executable, "-c", SUBMIT, json.dumps(train_config(tiny_model))],
            cwd=tmp_path,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'data' / 'rlwb.db'}")

        def status() -> str:
            with engine.connect() as connection:
                query = sa.text("select status from jobs where id = :id")
                return connection.execute(query, {"id": int(job_id)}).scalar()

        wait_for(lambda: status() in ("succeeded", "failed"), 60, "the job to finish")
        assert status() == "succeeded", log.read_text()
        children = _children(up.pid)
        assert children
    assert up.returncode == 0
    assert all(not Path(f"/proc/{child}").exists() for child in children)
