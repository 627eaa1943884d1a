"""``rlwb study``: run a study from a job file (its ``[study]`` table beside the jobs' common
fields), and show, cancel, resume or clone one by name.

    study run FILE              store the study and queue its first jobs
    study status NAME           the study and one line per job (its point and seed)
    study cancel NAME           make no more jobs; cancel the queued, stop the running
    study resume NAME           queue its cancelled and failed jobs again, then the rest
    study clone NAME NEW_NAME   a new study with the same config and search space
"""

import argparse
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

STUDY_TABLE = "study"


def add_study_command(commands: argparse._SubParsersAction) -> None:
    study = commands.add_parser(
        "study",
        help="run, show, cancel, resume or clone a study (jobs over a search space)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = study.add_subparsers(dest="study_command", required=True)
    actions.add_parser("run", help="run a study from a job file").add_argument(
        "file", type=Path, help="a .toml or .json job file with a [study] table"
    )
    for name, text in (
        ("status", "the study and its jobs"),
        ("cancel", "stop the study and its jobs"),
        ("resume", "run a cancelled study on"),
    ):
        actions.add_parser(name, help=text).add_argument("name")
    clone = actions.add_parser("clone", help="a new study with the same config and space")
    clone.add_argument("name")
    clone.add_argument("new_name")


def split_study_file(config: Any) -> tuple[dict[str, Any], Any]:
    """A job file's (common job fields, ``[study]`` table); `ValueError` without one."""
    if not isinstance(config, dict) or STUDY_TABLE not in config:
        raise ValueError(f"a study's job file needs a [{STUDY_TABLE}] table")
    base = {key: value for key, value in config.items() if key != STUDY_TABLE}
    return base, config[STUDY_TABLE]


def study_lines(study: Any, jobs: list[Any]) -> list[str]:
    """What ``study status`` prints: the study, then each job's point, seed and state."""
    counts = "  ".join(f"{status} {n}" for status, n in sorted(study.job_counts.items()))
    lines = [
        f"study {study.name} ({study.kind}, {study.status}): {study.jobs_made}/{study.max_jobs} "
        f"jobs made, {study.concurrency} at once  {counts}".rstrip()
    ]
    for job in jobs:
        point = " ".join(f"{k}={v}" for k, v in (job.study_point or {}).items())
        version = "-" if job.current_version is None else job.current_version
        error = f"  {job.error}" if job.error else ""
        lines.append(
            f"{job.id:>6}  {point}  seed={job.config.get('seed')}  {job.status:<10} "
            f"step {job.step}/{job.total_steps}  v{version}{error}"
        )
    return lines


def run_study_command(
    args: argparse.Namespace, read_config: Callable[[Path], dict[str, Any]]
) -> int:
    """One ``study`` action (``read_config`` reads a job file); a refused one prints why and
    returns 1."""
    from db import StorageError
    from workers import studies
    from workers.app import repository

    try:
        if args.study_command == "run":
            study = studies.run_study(*split_study_file(read_config(args.file)))
        elif args.study_command == "cancel":
            study = studies.cancel_study(args.name)
        elif args.study_command == "resume":
            study = studies.resume_study(args.name)
        elif args.study_command == "clone":
            study = studies.clone_study(args.name, args.new_name)
        else:
            study = repository().get_study(args.name)
    except (ValueError, StorageError, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"refused: {exc}")
        return 1
    print("\n".join(study_lines(study, repository().study_jobs(study.id))))
    return 0
