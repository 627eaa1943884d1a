"""The worker side of ``rlwb`` (`ui.cli` composes it with ``up`` and ``ui``), also
``python -m workers``:

    worker [ARGS]           a GPU worker (celery worker --pool threads -c 1 -Q gpu ARGS)
    worker --interactive    a worker for Playground chat (queue interactive)
    db upgrade              migrate the database (DATABASE_URL, else the SQLite file)
    train CONFIG            run a training job here, without UI or queue, writing to the DB
    submit CONFIG           queue a job for the workers and print its id
    jobs                    list the jobs
    resume JOB_ID           queue a failed or cancelled train job again, from its newest version
    cancel JOB_ID           cancel a job
    audit JOB_ID [--samples N]   re-score stored samples under their versions' weights

Environment: DATABASE_URL, REDIS_URL, RLWB_DATA_DIR (see workers/README.md).
"""

import argparse
import json
import os
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

COMMANDS = ("worker", "db", "train", "submit", "jobs", "resume", "cancel", "audit")
DEFAULT_AUDIT_SAMPLES = 20
WORKER_ARGS = ["--pool=threads", "--concurrency=1", "--queues=gpu"]
# Playground turns: short, two at a time, never behind a training job.
INTERACTIVE_ARGS = ["--pool=threads", "--concurrency=2", "--queues=interactive"]
EMBEDDED_ARGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `COMMANDS` to a parser's subcommands."""
    worker = commands.add_parser(
        "worker",
        help="run a GPU worker",
        description="A Celery worker for the gpu queue: threads pool, one job at a time. "
        "Further arguments go to `celery worker` (e.g. -n gpu0@%%h, --loglevel DEBUG).",
    )
    worker.add_argument(
        "--interactive",
        action="store_true",
        help="serve the interactive queue (Playground chat) instead of the gpu queue",
    )
    db = commands.add_parser("db", help="database migrations")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="upgrade to a revision (default: head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    train = commands.add_parser(
        "train",
        help="run a training job here (no queue), writing to the database",
        description="Run a GRPO job in this process, recorded in the database like a queued "
        "job. CONFIG is a JSON or TOML file of GRPOConfig fields (output_dir optional).",
    )
    train.add_argument("config", type=Path, help="a .json or .toml config file")
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
    audit = commands.add_parser(
        "audit",
        help="re-score stored samples under their versions' kept weights (attribution check)",
        description="Draw N stored samples of JOB at random across its versions, recompute "
        "their log-probs under the stamped version's kept weights and report the largest "
        "|stored - recomputed| per sample against the tolerance. Exit status 1 if any fails.",
    )
    audit.add_argument("job_id", type=int)
    audit.add_argument(
        "--samples", type=int, default=DEFAULT_AUDIT_SAMPLES, help="how many (max 200)"
    )


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Run one of `COMMANDS` (``extra``: the arguments ``worker`` passes on to Celery)."""
    if args.command == "worker":
        return run_worker(extra, args.interactive)
    if args.command == "db":
        from db import migrate

        migrate.upgrade(None, args.revision)
        return 0
    if args.command == "train":
        return run_train(args.config)
    if args.command == "audit":
        return run_audit(args.job_id, args.samples)
    return run_queue_command(args)


def worker_argv(extra: list[str], interactive: bool = False) -> list[str]:
    """``celery worker`` arguments for a GPU (or interactive) worker (quieter on the
    embedded broker)."""
    from workers.settings import Settings

    embedded = EMBEDDED_ARGS if Settings.from_env().embedded else []
    role = INTERACTIVE_ARGS if interactive else WORKER_ARGS
    return ["worker", *role, *embedded, "--loglevel=INFO", *extra]


def run_worker(extra: list[str], interactive: bool = False) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from workers.app import app

    app.worker_main(worker_argv(extra, interactive))
    return 0


def read_config(path: Path) -> dict[str, Any]:
    """A job file: JSON, or TOML for a ``.toml`` name."""
    text = path.read_text()
    return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)


def _print_progress(meta: dict[str, Any]) -> None:
    fields = [f"step {meta['step']}/{meta['total_steps']}"]
    if meta.get("version") is not None:
        fields.append(f"version {meta['version']}")
    if meta.get("batch"):
        fields.append(meta["batch"])
    if meta.get("reward_mean") is not None:
        fields.append(f"reward {meta['reward_mean']:.3f}")
    print("  ".join(fields), flush=True)


def run_train(path: Path) -> int:
    """Create a train job for ``path`` and run it in this process."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from db import migrate
    from workers.app import repository
    from workers.jobs import run_job
    from workers.settings import Settings
    from workers.specs import validate

    config = read_config(path)
    total_steps = validate("train", config)
    migrate.upgrade()
    repo = repository()
    job = repo.create_job("train", config, total_steps=total_steps)
    print(f"job {job.id}", flush=True)
    outcome = run_job(repo, job.id, Settings.from_env(), progress=_print_progress)
    print(f"job {job.id} {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))
    return 0 if outcome.status == "succeeded" else 1


def _line(job: Any) -> str:
    progress = f"{job.step}/{job.total_steps if job.total_steps is not None else '?'}"
    version = "-" if job.current_version is None else job.current_version
    error = f"  {job.error}" if job.error else ""
    return f"{job.id:>6}  {job.kind:<8} {job.status:<10} step {progress:<11} v{version}{error}"


def run_queue_command(args: argparse.Namespace) -> int:
    """``submit``, ``jobs``, ``resume`` or ``cancel`` through `workers.api`; a refused
    request prints why and returns 1."""
    from db import StorageError
    from workers import api
    from workers.app import repository

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


def main(argv: list[str] | None = None) -> int:
    """``python -m workers``: the worker side of ``rlwb`` alone."""
    parser = argparse.ArgumentParser(
        prog="python -m workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_commands(parser.add_subparsers(dest="command", required=True))
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return run(args, extra)


def _audit_line(result: dict[str, Any]) -> str:
    diff = result.get("max_abs_diff")
    shown = "-" if diff is None else f"{diff:.3g}"
    where = f"v{result['version']}" if "version" in result else "-"
    line = (
        f"sample {result['sample_id']:>8}  {where:<6} {result.get('tokens', 0):>5} tokens  "
        f"max |stored - recomputed| {shown:<9} {result['status']}"
    )
    return line + (f"  ({result['problem']})" if result.get("problem") else "")


def run_audit(job_id: int, samples: int) -> int:
    """Audit ``samples`` random stored samples of a job, here, and print one line per sample
    and a summary; 1 if a sample failed or erred (see `workers.scoring`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from db import NotFound, StorageError
    from workers.app import repository
    from workers.scoring import AUDIT_TOLERANCE, MAX_AUDIT_SAMPLES, audit_samples
    from workers.settings import Settings

    if not 1 <= samples <= MAX_AUDIT_SAMPLES:
        print(f"refused: --samples must be from 1 to {MAX_AUDIT_SAMPLES}")
        return 1
    repo = repository()
    try:
        ids = repo.random_sample_ids(job_id, samples)
    except (NotFound, StorageError) as exc:
        print(f"refused: {exc}")
        return 1
    if not ids:
        print(f"job {job_id} has no stored samples with a response")
        return 1
    results = audit_samples(repo, Settings.from_env(), ids)["samples"]
    for result in results:
        print(_audit_line(result), flush=True)
    counts = Counter(result["status"] for result in results)
    print(
        f"{len(results)} samples: "
        + ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
        + f" (tolerance {AUDIT_TOLERANCE:g} per token, fp32)"
    )
    return 1 if counts["fail"] or counts["error"] else 0
