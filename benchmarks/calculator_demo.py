"""The calculator policy learning from Launch: held-out accuracy of greedy episodes over versions.

Fills in the Launch form as a user does who picks "built-in calculator policy" and presses
Launch (Launch's defaults, the policy's preset: `word_problems` in the `calculator`
environment, 16 prompts x 8 episodes, lr 3e-4, at most 5 turns of 48 tokens), turns it into
the job the form submits (`ui.handlers.launch.train_config`), and runs that job through the
worker's own job runner (`workers.jobs.run_job`) on a fresh SQLite database in a temporary
data directory. The worker scores 200 held-out word problems (greedy episodes, never drawn
for training) at the start and every 10 versions; this prints them as they are stored, with
at the end each with the minutes since version 0 was stored (evaluations included), and
optionally writes them as a CSV.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calculator_demo.py --out curve.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


def launch_form(steps: int | None) -> dict:
    """The Launch form's values after choosing the calculator policy (and `steps`, if given)."""
    from ui.handlers.launch import FORM_FIELDS, SINGLE_TURN, TASK_SOURCE
    from ui.handlers.model_form import preset_values
    from ui.handlers.reward_form import TASK_DEFAULT_REWARD
    from workers import api

    form = {name: api.LAUNCH_DEFAULTS.get(name) for name in FORM_FIELDS}
    form |= {"source": TASK_SOURCE, "reward": TASK_DEFAULT_REWARD, "environment": SINGLE_TURN}
    form |= {"model": api.CALCULATOR_MODEL, **preset_values(api.CALCULATOR_MODEL)}
    return form if steps is None else {**form, "steps": steps}


def use_temporary_data() -> Path:
    """A fresh data directory and SQLite database in a temporary folder, for this process."""
    data = Path(tempfile.mkdtemp(prefix="calculator-demo-"))
    os.environ.update(RLWB_DATA_DIR=str(data), DATABASE_URL=f"sqlite:///{data / 'rlwb.db'}")
    os.environ.pop("REDIS_URL", None)
    return data


def submit_launch(data: Path, form: dict) -> tuple[Any, Any]:
    """(the repository, the job) Launch creates for `form`, in the database of `data`."""
    from db import upgrade
    from ui.handlers.launch import train_config
    from ui.services import Services
    from workers.app import repository

    upgrade()
    repo = repository()
    unused = lambda *args, **kwargs: None  # noqa: E731  (the form is only validated)
    actions = [f.name for f in fields(Services) if f.name != "repository" and f.init]
    actions = [name for name in actions if name not in ("model_roots", "data_dir")]
    services = Services(repo, **dict.fromkeys(actions, unused), model_roots=(data,), data_dir=data)
    config = train_config(services, **form)
    print("job:", config, flush=True)
    return repo, repo.create_job("train", config, total_steps=config["steps"])


def run_submitted(repo: Any, job_id: int, progress: Callable[..., None] | None = None) -> Any:
    """The job run to its end by the worker's own job runner, in this process: its outcome."""
    from workers.jobs import run_job
    from workers.settings import Settings

    return run_job(repo, job_id, Settings.from_env(), progress=progress)


def heldout_points(repo: Any, job_id: int) -> list[tuple[int, float, float]]:
    """(version, minutes since version 0 was stored, held-out accuracy) of each scored version."""
    from workers.specs import HELDOUT_METRIC

    versions = repo.list_versions(job_id)
    return [
        (
            v.version,
            (v.created_at - versions[0].created_at).total_seconds() / 60,
            v.metrics.extra[HELDOUT_METRIC],
        )
        for v in versions
        if HELDOUT_METRIC in v.metrics.extra
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="instead of the preset's")
    parser.add_argument("--out", type=Path, help="a CSV of version, minutes, accuracy")
    args = parser.parse_args()
    data = use_temporary_data()
    import torch

    from workers.specs import HELDOUT_METRIC

    torch.set_num_threads(1)
    repo, job = submit_launch(data, launch_form(args.steps))
    start, shown = time.perf_counter(), set()

    def progress(*_: object) -> None:  # each held-out score once it is stored
        for version in repo.list_versions(job.id):
            accuracy = version.metrics.extra.get(HELDOUT_METRIC)
            if accuracy is not None and version.version not in shown:
                shown.add(version.version)
                minutes = (time.perf_counter() - start) / 60
                print(f"v{version.version:<4} {minutes:6.2f} min  {accuracy:.3f}", flush=True)

    outcome = run_submitted(repo, job.id, progress)
    progress()
    print(f"job {outcome.status}: {(time.perf_counter() - start) / 60:.1f} minutes")
    points = heldout_points(repo, job.id)
    print("version  minutes  held-out accuracy (minutes: since version 0 was stored)")
    for version, minutes, accuracy in points:
        print(f"{version:>7} {minutes:8.2f}  {accuracy:.3f}")
    if args.out:
        with args.out.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["version", "minutes", "heldout_accuracy"])
            writer.writerows(points)


if __name__ == "__main__":
    main()
