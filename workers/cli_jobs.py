"""``rlwb submit|jobs|resume|cancel``: the queue from the shell, through `workers.api`."""

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

JOB_COMMANDS = ("submit", "jobs", "resume", "cancel")


def read_config(path: Path) -> dict[str, Any]:
    """A job file: JSON, or TOML for a ``.toml`` name."""
    text = path.read_text()
    return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)


def add_commands(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser(
        "submit",
        help="queue a job from a file and print its id",
        description="Validate CONFIG as the UI does and queue it for a worker.",
    )
    submit.add_argument("config", type=Path, help="a .json or .toml job file")
    submit.add_argument("--kind", default="train", choices=("train", "evaluate", "compare"))
    jobs = commands.add_parser("jobs", help="list jobs, newest first")
    jobs.add_argument("--limit", type=int, default=20)
    for name, text in (
        ("resume", "queue a failed or cancelled train job again (from its newest checkpoint)"),
        ("cancel", "cancel a queued or running job"),
    ):
        commands.add_parser(name, help=text).add_argument("job_id", type=int)


def _line(job: Any) -> str:
    progress = f"{job.step}/{job.total_steps if job.total_steps is not None else '?'}"
    version = "-" if job.current_version is None else job.current_version
    error = f"  {job.error}" if job.error else ""
    return f"{job.id:>6}  {job.kind:<8} {job.status:<10} step {progress:<11} v{version}{error}"


def run(args: argparse.Namespace) -> int:
    """Run one of `JOB_COMMANDS`; a refused request prints why and returns 1."""
    from db import StorageError
    from workers import api
    from workers.storage import repository

    try:
        if args.command == "submit":
            print(api.submit_job(args.kind, read_config(args.config)).id)
        elif args.command == "jobs":
            for job in repository().list_jobs(limit=args.limit):
                print(_line(job))
        elif args.command == "resume":
            print(_line(api.resume_job(args.job_id)))
        else:
            print(_line(api.cancel_job(args.job_id)))
    except (ValueError, StorageError, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"refused: {exc}")
        return 1
    return 0
