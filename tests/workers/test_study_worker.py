"""A study on a real ``celery worker`` and Redis (`tests.workers.stack`): ``rlwb study run``
queues the first jobs, the worker's finishing jobs send the next, and on one worker the jobs
start in plan order (each point's seeds together) and the study completes."""

import pytest

from db import JobStatus, StudyStatus
from tests.workers.helpers import wait_for

pytestmark = pytest.mark.slow

STUDY_FILE = """
model = "demo"
task = "addition"
steps = 1
batch_size = 2
group_size = 2
max_tokens = 6
heldout_every = 1
heldout_prompts = 2

[study]
name = "grid"
grid = { lr = [0.001, 0.003], temperature = [0.7, 1.0] }
seeds = 2
concurrency = 2
"""


def test_a_grid_study_runs_on_a_worker_in_plan_order_and_completes(stack):
    path = stack.root / "study.toml"
    path.write_text(STUDY_FILE)
    with stack.worker("gpu0"):
        out = stack.rlwb("study", "run", str(path))
        assert out.startswith("study grid (grid, running):")
        done = wait_for(
            lambda: stack.repo.get_study("grid").status is StudyStatus.COMPLETED,
            600,
            "the study",
            interval=0.5,
        )
        assert done, stack.log("gpu0")
    study = stack.repo.get_study("grid")
    assert study.job_counts == {"succeeded": 8}
    jobs = stack.repo.study_jobs(study.id)
    points = [(j.study_point["lr"], j.study_point["temperature"], j.config["seed"]) for j in jobs]
    assert points == [(lr, t, seed) for lr in (0.001, 0.003) for t in (0.7, 1.0) for seed in (0, 1)]
    started = sorted(jobs, key=lambda j: j.started_at)
    assert [j.id for j in started] == [j.id for j in jobs]  # whole seed sets first
    for job in jobs:
        scores = [v.metrics.extra.get("heldout_accuracy") for v in stack.repo.list_versions(job.id)]
        assert len(scores) == 2 and None not in scores
    assert all(j.status is JobStatus.SUCCEEDED for j in jobs)
