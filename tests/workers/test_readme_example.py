"""The README's job-file example as a user copies it (issue 32): ``rlwb submit`` from the
repository root takes it, the shipped demo policy allowed whatever ``RLWB_MODEL_ROOTS`` says,
and submitted twice both jobs train, each in a folder of its own."""

import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from core_engine.assets import SHIPPED_POLICY
from db import JobStatus
from tests.workers.helpers import wait_for
from tests.workers.stack import ROOT

HANG_GUARD_S = 600  # a version of the example takes seconds; only a hang waits this long

pytestmark = pytest.mark.slow


def readme_job_file() -> str:
    """The TOML block after "A job file holds `GRPOConfig` fields" in README.md."""
    text = (ROOT / "README.md").read_text()
    after = text.split("A job file holds `GRPOConfig` fields", 1)[1]
    return after.split("```toml\n", 1)[1].split("```", 1)[0]


def _trained(stack, job: int) -> bool:
    """A version trained (or the job ended without one: the assertions below say why)."""
    info = stack.repo.get_job(job)
    return (info.current_version or 0) >= 1 or info.status.is_terminal


def _ended(stack, job: int) -> bool:
    return stack.status(job).is_terminal


def test_the_readme_job_file_runs_as_written_twice(embedded_stack, tmp_path):
    stack, job_file = embedded_stack, tmp_path / "job.toml"
    job_file.write_text(readme_job_file())
    assert "demo-policy" in job_file.read_text()
    submit = [sys.executable, "-m", "ui", "submit", str(job_file)]
    with stack.worker("gpu0"):
        ids = []
        for _ in range(2):
            done = subprocess.run(submit, cwd=ROOT, env=stack.env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            ids.append(int(done.stdout))
        for job in ids:  # one after the other: each trains a version, then is cancelled
            wait_for(partial(_trained, stack, job), HANG_GUARD_S, f"a version of job {job}")
            stack.repo.request_cancel(job)
            wait_for(partial(_ended, stack, job), HANG_GUARD_S, f"job {job} to stop")
    folders = set()
    for job in ids:
        info = stack.repo.get_job(job)
        assert (info.status, info.error) == (JobStatus.CANCELLED, None), stack.log("gpu0")
        assert info.config["model"] == str(SHIPPED_POLICY)
        [newest] = [v for v in stack.repo.list_versions(job) if v.version == info.current_version]
        folders.add(Path(newest.checkpoint_path).parent)
    assert folders == {stack.root / "data" / "jobs" / str(job) for job in ids}
