"""Issue 45 item 4: a job's environment processes end with the job. An environment whose
every step starts a spinning grandchild (the pids written to a file) runs a 2-step training
job with held-out evaluation; once the job has succeeded, none of those processes runs."""

import json

from tests.core_engine.test_environment_processes import all_gone, running
from tests.workers.helpers import train_config
from workers.jobs import run_job

SPAWNER = """
import os, subprocess, sys

PIDS = {pids!r}
SPIN = "import time\\nwhile True: time.sleep(0.05)"


class Spawner:
    tools = []

    def reset(self, task):
        return [{{"role": "user", "content": "say 7"}}]

    def step(self, turn):
        spinner = subprocess.Popen([sys.executable, "-c", SPIN])
        with open(PIDS, "a") as f:
            f.write(f"{{os.getpid()}} {{spinner.pid}}\\n")
        return {{"messages": [], "reward": float("7" in turn["text"]), "done": True}}
"""


def test_a_finished_jobs_environment_processes_are_gone(
    repo, settings, tiny_model, tmp_path, monkeypatch
):
    pids = tmp_path / "pids"
    (tmp_path / "rlwb_env_spawner.py").write_text(SPAWNER.format(pids=str(pids)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "spawner=rlwb_env_spawner:Spawner")
    config = train_config(
        tiny_model,
        steps=2,
        environment="spawner",
        max_turns=1,
        max_episode_tokens=64,
        heldout_every=1,
        heldout_prompts=2,
    )
    job = repo.create_job("train", config, total_steps=2)
    assert run_job(repo, job.id, settings).status == "succeeded", repo.get_job(job.id).error
    started = [int(pid) for line in pids.read_text().splitlines() for pid in line.split()]
    assert len(started) >= 2 * 2  # environment children and their spinners, of both steps
    assert all_gone(started), json.dumps([p for p in started if running(p)])
