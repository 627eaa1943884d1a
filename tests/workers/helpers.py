"""Shared helpers of the worker tests: tiny configs, a slow reward, polling."""

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import STDOUT, Popen, TimeoutExpired
from typing import Any, TypeVar

T = TypeVar("T")


def train_config(model: str, **overrides: Any) -> dict[str, Any]:
    """A tiny always7 run on the tiny model: every batch accepted (zero-variance groups kept,
    so the version advances even though a random model never answers 7)."""
    config = {
        "model": model,
        "task": "always7",
        "steps": 3,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 4,
        "drop_zero_variance_groups": False,
    }
    return {**config, **overrides}


def slow_exact_match(completions, references, prompts):
    """exact_match that takes 0.2 s per batch: makes steps slow enough to watch and kill."""
    time.sleep(0.2)
    return [float(c.strip() == r.strip()) for c, r in zip(completions, references, strict=True)]


def stuck_reward(completions, references, prompts):
    """A reward that never returns (the worker must time it out)."""
    while True:
        time.sleep(60)


# The operator's registrations (RLWB_REWARDS) that the worker tests run with.
SLOW_REWARD = "slow_exact_match"
REGISTERED_REWARDS = (
    "slow_exact_match=tests.workers.helpers:slow_exact_match,"
    "stuck=tests.workers.helpers:stuck_reward"
)


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def samples_in_db(repo, job_id: int) -> int:
    from db import SampleFilter

    total, cursor = 0, None
    while True:
        page = repo.list_samples(SampleFilter(job_id=job_id), cursor=cursor, limit=1000)
        total += len(page.items)
        if page.next_cursor is None:
            return total
        cursor = page.next_cursor


def assert_consistent(repo, job_id: int, versions: int, samples_per_batch: int) -> None:
    """Versions 0..``versions`` with no gap or duplicate; the newest with its checkpoint, older
    ones with theirs unless retention dropped it; exactly one accepted batch per optimizer
    step; every batch whole."""
    import json
    from pathlib import Path

    recorded = repo.list_versions(job_id)
    assert [v.version for v in recorded] == list(range(versions + 1))
    assert [v.parent_version for v in recorded] == [None, *range(versions)]
    assert (Path(recorded[-1].checkpoint_path) / "trainer_state.json").is_file()
    for v in recorded[1:]:
        if Path(v.checkpoint_path).is_dir():  # else dropped by the retention policy
            state = json.loads((Path(v.checkpoint_path) / "trainer_state.json").read_text())
            assert state["version"] == v.version
    batches = repo.list_batches(job_id)
    accepted = [b for b in batches if b.status == "accepted"]
    assert [(b.step, b.policy_version) for b in accepted] == [(s, s) for s in range(versions)]
    assert all(b.num_samples == samples_per_batch for b in batches)
    assert samples_in_db(repo, job_id) == samples_per_batch * len(batches)


@contextmanager
def running(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[Popen]:
    """A subprocess logging to ``log``; stopped (SIGTERM, then SIGKILL) by its pid on exit."""
    with open(log, "w") as out:
        process = Popen(argv, cwd=cwd, env=env, stdout=out, stderr=STDOUT)
        try:
            yield process
        finally:
            stop(process)


def stop(process: Popen, timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except TimeoutExpired:
            process.kill()
            process.wait()
