"""The ``rlwb`` command (`ui.cli`): help everywhere, db upgrade, train without the queue, ui,
and ``up`` end to end, on the embedded broker and on Redis."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

import ui.app
from db import JobStatus, Repository
from tests.workers.helpers import (
    REGISTERED_REWARDS,
    SLOW_REWARD,
    running,
    train_config,
    wait_for,
)
from tests.workers.served import free_port, table_rows, ui_client
from ui import cli
from workers.commands import worker_argv

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = (
    "import json, sys; from workers.api import submit_job;"
    "print(submit_job('train', json.loads(sys.argv[1])).id)"
)


@pytest.mark.parametrize(
    "command",
    [[], ["up"], ["worker"], ["ui"], ["db"], ["db", "upgrade"], ["train"], ["export"], ["study"]],
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


def test_train_refuses_what_submit_refuses_and_stores_no_job(
    env, repo, tmp_path, capsys, monkeypatch
):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    config = {k: v for k, v in train_config("demo").items() if k != "task"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**config, "data": str(outside)}))
    monkeypatch.setenv("RLWB_MODEL_ROOTS", str(env))  # the data directory alone

    assert cli.main(["train", str(path)]) == 1

    assert "refused: data: " in capsys.readouterr().out
    assert repo.list_jobs() == []


def test_jobs_says_when_there_are_none(env, capsys):
    assert cli.main(["jobs"]) == 0
    assert capsys.readouterr().out.startswith("no jobs yet")


def test_jobs_piped_into_head_ends_quietly(env, repo):
    """``rlwb jobs | head -1``: head leaves after one line while the listing (over a pipe's
    64 KiB) is still being written; the command ends without a traceback."""
    for _ in range(300):
        repo.create_job("train", {}, total_steps=1)
    with repo.engine.begin() as connection:
        connection.execute(sa.text("update jobs set error = :error"), {"error": "x" * 400})
    listing = f"{sys.executable} -m ui jobs --limit 300 | head -1"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(listing, shell=True, env=environment, capture_output=True, text=True)
    assert done.stdout.split()[:3] == ["300", "train", "queued"]
    assert done.stderr == ""


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


def test_each_worker_role_has_its_own_node_name_unless_told():
    gpu, chat = worker_argv([]), worker_argv([], interactive=True)
    assert gpu[:4] == ["worker", "--pool=threads", "--concurrency=1", "--queues=gpu"]
    assert chat[:4] == ["worker", "--pool=threads", "--concurrency=2", "--queues=interactive"]
    assert "--hostname=gpu@%h" in gpu and "--hostname=chat@%h" in chat
    assert worker_argv(["-n", "gpu0@%h"])[-2:] == ["-n", "gpu0@%h"]  # last, so it wins


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.fixture(params=["embedded", "redis"])
def broker(request: pytest.FixtureRequest) -> dict[str, str]:
    """``rlwb up``'s broker: none to configure (embedded), or an empty Redis database."""
    if request.param == "embedded":
        return {}
    return {"REDIS_URL": request.getfixturevalue("redis_url")}


def _celery(env: dict[str, str], cwd: Path, *args: str) -> str:
    argv = [sys.executable, "-m", "celery", "-A", "workers.app", *args]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_up_shows_both_workers_and_the_running_job(broker, tmp_path, tiny_model):
    """``rlwb up`` with SQLite in the data dir, on the embedded broker or Redis: migrations, a
    GPU worker and a chat worker (child processes), the UI. While a job trains, the Queue tab
    (through its API) and ``celery inspect active`` both list the two nodes, gpu@<host> and
    chat@<host>, and the job's task on gpu@<host>. ``rlwb cancel`` stops the job; SIGTERM
    stops everything."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RLWB_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(RLWB_MODEL_ROOTS=tempfile.gettempdir(), RLWB_REWARDS=REGISTERED_REWARDS, **broker)
    host = socket.gethostname()
    gpu, chat = f"gpu@{host}", f"chat@{host}"
    port, log = free_port(), tmp_path / "up.log"
    argv = [sys.executable, "-m", "ui", "up", "--port", str(port)]
    with running(argv, env, tmp_path, log) as up:
        client = ui_client(port, up)
        try:
            wait_for(lambda: log.read_text().count(" ready.") == 2, 90, "both workers to start")
        except AssertionError as timeout:
            raise AssertionError(log.read_text()[-4000:]) from timeout
        config = train_config(tiny_model, steps=10_000, reward=SLOW_REWARD)
        job_id = subprocess.run(
            [sys.executable, "-c", SUBMIT, json.dumps(config)],
            cwd=tmp_path,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        repo = Repository.from_url(f"sqlite:///{tmp_path / 'data' / 'rlwb.db'}")
        job = wait_for(
            lambda: (j := repo.get_job(int(job_id))).current_version and j, 90, "a version"
        )

        summary, workers, active, _, _ = client.predict(api_name="/queue")
        assert "**2** worker(s) online · **1** active" in summary, summary
        assert sorted(row["worker"] for row in table_rows(workers)) == [chat, gpu]
        tasks = [(row["worker"], row["task_id"]) for row in table_rows(active)]
        assert tasks == [(gpu, job.celery_task_id)]
        inspected = json.loads(_celery(env, tmp_path, "inspect", "active", "--json"))
        assert sorted(inspected) == [chat, gpu]
        assert [task["id"] for task in inspected[gpu]] == [job.celery_task_id]
        assert inspected[chat] == []

        subprocess.run([sys.executable, "-m", "ui", "cancel", job_id], env=env, check=True)
        wait_for(lambda: repo.get_job(int(job_id)).status.is_terminal, 60, "the cancel")
        assert repo.get_job(int(job_id)).status is JobStatus.CANCELLED
        repo.close()
        children = _children(up.pid)
        assert len(children) == 2
    assert up.returncode == 0
    assert all(not Path(f"/proc/{child}").exists() for child in children)


def _worker_children(pid: int) -> dict[str, int]:
    """``rlwb up``'s worker children by role (gpu, chat), read from their command lines."""
    roles = {}
    tasks = Path(f"/proc/{pid}/task").iterdir()  # a restarted one is its watcher thread's
    for child in (int(c) for task in tasks for c in (task / "children").read_text().split()):
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"worker" in argv:
            roles["chat" if b"--interactive" in argv else "gpu"] = child
    return roles


# Issue 45, a Low: ``rlwb up`` started its workers once; one that died stayed dead.
@pytest.mark.slow
def test_up_starts_a_worker_that_died_again(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RLWB_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    log = tmp_path / "up.log"
    with running([sys.executable, "-m", "ui", "up", "--no-ui"], env, tmp_path, log) as up:
        wait_for(lambda: log.read_text().count(" ready.") == 2, 90, "both workers to start")
        first = _worker_children(up.pid)
        assert sorted(first) == ["chat", "gpu"]
        os.kill(first["gpu"], signal.SIGKILL)
        wait_for(lambda: log.read_text().count(" ready.") == 3, 90, "the worker to start again")
        again = _worker_children(up.pid)
        assert again["chat"] == first["chat"] and again["gpu"] != first["gpu"]
        assert f"the gpu worker (pid {first['gpu']}) was killed (signal 9): starting it again" in (
            log.read_text()
        )
    assert up.returncode == 0
    assert all(not Path(f"/proc/{child}").exists() for child in again.values())
