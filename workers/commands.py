"""The worker side of ``rlwb`` (`ui.cli` composes it with ``up`` and ``ui``), also
``python -m workers``:

    worker [ARGS]           a GPU worker gpu@%h (celery worker --pool threads -c 1 -Q gpu ARGS)
    worker --interactive    a worker for Playground chat chat@%h (queue interactive)
    db upgrade              migrate the database (DATABASE_URL, else the SQLite file)
    train CONFIG            run a training job here, without UI or queue, writing to the DB
    submit CONFIG           queue a job for the workers and print its id
    jobs                    list the jobs
    resume JOB_ID           requeue a failed, stalled, pruned or cancelled train job
    cancel JOB_ID           cancel a job
    audit JOB_ID [--samples N]   re-score stored samples under their versions' weights
    export JOB_ID VERSION DIR [--merged]   write a version's adapter, merged model or checkpoint
    study run FILE | status/cancel/resume NAME | clone NAME NEW   (workers.study_commands)

Environment: DATABASE_URL, REDIS_URL, RLWB_DATA_DIR (see docs/operations.md).
"""

import argparse
import json
import os
import random
import shutil
import sys
import tomllib
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from workers.audit_lines import audit_line, coverage_line, shortfall_line
from workers.cli_errors import guarded
from workers.study_commands import add_study_command, run_study_command

COMMANDS = (
    "worker",
    "db",
    "train",
    "submit",
    "jobs",
    "resume",
    "cancel",
    "audit",
    "export",
    "study",
)
DEFAULT_AUDIT_SAMPLES = 20
# Each role has its own node name (%h: this host), so two workers on one host both answer
# `celery inspect`; a -n/--hostname passed on comes later and wins (e.g. gpu0@%h, gpu1@%h).
WORKER_ARGS = ["--pool=threads", "--concurrency=1", "--queues=gpu", "--hostname=gpu@%h"]
# Playground turns: short, two at a time, never behind a training job.
INTERACTIVE_ARGS = [
    "--pool=threads",
    "--concurrency=2",
    "--queues=interactive",
    "--hostname=chat@%h",
]
EMBEDDED_ARGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `COMMANDS` to a parser's subcommands."""
    worker = commands.add_parser(
        "worker",
        help="run a GPU worker",
        description="A Celery worker for the gpu queue: threads pool, one job at a time, "
        "named gpu@%h (chat@%h with --interactive). Further arguments go to `celery "
        "worker` (e.g. -n gpu0@%h for a second GPU worker on this host, --loglevel DEBUG).",
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
        (
            "resume",
            "queue a failed, stalled, pruned or cancelled train job again (from its last version)",
        ),
        ("cancel", "cancel a queued or running job"),
    ):
        commands.add_parser(name, help=text).add_argument("job_id", type=int)
    audit = commands.add_parser(
        "audit",
        help="re-score stored samples under their versions' kept weights (attribution check)",
        description="Draw N stored samples of JOB at random from the versions whose weights "
        "were kept, recompute their log-probs under those weights and report the largest "
        "|stored - recomputed| per sample against the tolerance, then the coverage: how many "
        "were checked, and which versions could not be. Exit status 1 if any fails or "
        "nothing could be checked.",
    )
    audit.add_argument("job_id", type=int)
    audit.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_AUDIT_SAMPLES,
        help="how many (one run checks at most 200, and says so when asked for more)",
    )
    export = commands.add_parser(
        "export",
        help="write a kept version's weights to a new directory",
        description="Write a LoRA version's PEFT adapter (or, --merged, a checkpoint of base "
        "and adapter merged), or a full-weight version's checkpoint, to DIR (new or empty).",
    )
    export.add_argument("job_id", type=int)
    export.add_argument("version", type=int)
    export.add_argument("directory", type=Path)
    export.add_argument("--merged", action="store_true", help="merge a LoRA adapter into its base")
    add_study_command(commands)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Run one of `COMMANDS` (``extra``: the arguments ``worker`` passes on to Celery). A
    reader that stops early (``rlwb jobs | head``) ends it quietly, with status 1."""
    try:
        status = _run_command(args, extra)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        # Python's recipe (signal module docs, "Note on SIGPIPE"): what is left to flush
        # at exit goes nowhere instead of raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def _run_command(args: argparse.Namespace, extra: list[str]) -> int:
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
    if args.command == "export":
        return run_export(args.job_id, args.version, args.directory, args.merged)
    if args.command == "study":
        return run_study_command(args, read_config)
    return run_queue_command(args)


def worker_argv(extra: list[str], interactive: bool = False) -> list[str]:
    """``celery worker`` arguments for a GPU (or interactive) worker, named ``gpu@%h`` (or
    ``chat@%h``) unless ``extra`` names it (quieter on the embedded broker)."""
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
    """A job file: JSON, or TOML for a ``.toml`` name (a regular file of bounded size, else
    `core_engine.user_files.UnsafeFileError`, a `ValueError`)."""
    from core_engine.user_files import MAX_TEXT_BYTES, read_text

    text = read_text(path, MAX_TEXT_BYTES)
    return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)


def _print_progress(meta: dict[str, Any]) -> None:
    if meta.get("phase"):  # before the steps: e.g. a Hub model's download
        print(meta["phase"], flush=True)
        return
    fields = [f"step {meta['step']}/{meta['total_steps']}"]
    if meta.get("version") is not None:
        fields.append(f"version {meta['version']}")
    if meta.get("batch"):
        fields.append(meta["batch"])
    if meta.get("reward_mean") is not None:
        fields.append(f"reward {meta['reward_mean']:.3f}")
    print("  ".join(fields), flush=True)


def run_train(path: Path) -> int:
    """Create a train job for ``path`` and run it in this process; a config that `submit`
    would refuse is refused alike (1 and why), storing no job."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from db import migrate
    from workers.app import repository
    from workers.jobs import run_job
    from workers.settings import Settings
    from workers.specs import SpecError
    from workers.submission import create_checked_job

    config = read_config(path)
    migrate.upgrade()
    repo, settings = repository(), Settings.from_env()
    try:
        job = create_checked_job(repo, "train", config)
    except SpecError as exc:
        print(f"refused: {exc}")
        return 1
    print(f"job {job.id}", flush=True)
    outcome = run_job(repo, job.id, settings, progress=_print_progress)
    print(f"job {job.id} {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))
    return 0 if outcome.status == "succeeded" else 1


def _line(job: Any) -> str:
    progress = f"{job.step}/{job.total_steps if job.total_steps is not None else '?'}"
    version = "-" if job.current_version is None else job.current_version
    error = f"  {job.error}" if job.error else ""
    return f"{job.id:>6}  {job.kind:<8} {job.status:<10} step {progress:<11} v{version}{error}"


def run_queue_command(args: argparse.Namespace) -> int:
    """``submit``, ``jobs``, ``resume`` or ``cancel`` through `workers.submission`; a
    refused request prints why and returns 1."""
    from db import StorageError
    from workers import submission
    from workers.app import repository

    try:
        if args.command == "submit":
            print(submission.submit_job(args.kind, read_config(args.config)).id)
        elif args.command == "jobs":
            jobs = repository().list_jobs(limit=args.limit)
            for job in jobs:
                print(_line(job))
            if not jobs:
                print("no jobs yet: `rlwb submit JOB_FILE` queues one (or Launch in the UI)")
        elif args.command == "resume":
            print(_line(submission.resume_job(args.job_id)))
        else:
            print(_line(submission.cancel_job(args.job_id)))
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
    return guarded(partial(run, args, extra))


def run_audit(job_id: int, samples: int) -> int:
    """Audit ``samples`` stored samples of a job, drawn at random from the versions whose
    weights were kept, here; print one line per sample and the coverage. 1 if nothing could
    be checked, or a sample failed or erred (see `workers.scoring`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from db import MAX_PAGE_SIZE, NotFound, StorageError
    from workers.app import repository
    from workers.kept_weights import weights_kept
    from workers.scoring import AUDIT_TOLERANCE, MAX_AUDIT_SAMPLES, audit_samples
    from workers.settings import Settings

    if samples < 1:
        print("refused: --samples must be at least 1")
        return 1
    repo = repository()
    try:
        versions = [v for v in repo.version_metrics(job_id) if v.num_samples]
    except (NotFound, StorageError) as exc:
        print(f"refused: {exc}")
        return 1
    if not versions:
        print(f"job {job_id} has no stored samples")
        return 1
    kept = {v.version for v in versions if v.recorded is not None and weights_kept(v.recorded)}
    not_kept = {v.version: v.num_samples for v in versions if v.version not in kept}
    drawn_from = random.sample(sorted(kept), min(len(kept), MAX_PAGE_SIZE))
    ids = repo.random_sample_ids(job_id, min(samples, MAX_AUDIT_SAMPLES), drawn_from)
    results = audit_samples(repo, Settings.from_env(), ids)["samples"] if ids else []
    for result in results:
        print(audit_line(result), flush=True)
    if len(results) < samples:
        print(shortfall_line(samples, len(results), MAX_AUDIT_SAMPLES))
    statuses = Counter(result["status"] for result in results)
    print(coverage_line(statuses, not_kept) + f" (tolerance {AUDIT_TOLERANCE:g} per token, fp32)")
    checked = statuses["pass"] + statuses["fail"]
    return 1 if not checked or statuses["fail"] or statuses["error"] else 0


def run_export(job_id: int, version: int, directory: Path, merged: bool) -> int:
    """The ``export`` command: a kept version's adapter, merged model or checkpoint (its
    training state left out) written to ``directory`` at once; 1 and why when refused."""
    from core_engine.adapters import export_merged, is_adapter_dir
    from core_engine.atomic_dir import new_dir
    from core_engine.rl.trainer.checkpoint import TRAINING_STATE
    from db import NotFound
    from workers.app import repository
    from workers.engines import WeightsNotKept, saved_version

    try:
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            raise FileExistsError(f"{directory} exists and is not an empty directory")
        source = Path(saved_version(repository(), job_id, version).checkpoint_path)
        adapter = is_adapter_dir(source)
        if merged and adapter:
            export_merged(source, directory)
        else:
            with new_dir(directory) as staging:
                ignore = shutil.ignore_patterns(*TRAINING_STATE)
                shutil.copytree(source, staging, ignore=ignore, dirs_exist_ok=True)
    except (NotFound, WeightsNotKept, OSError, ValueError) as exc:
        print(f"refused: {exc}")
        return 1
    what = "merged checkpoint" if merged and adapter else "adapter" if adapter else "checkpoint"
    print(f"job {job_id} version {version}: {what} written to {directory}")
    return 0
