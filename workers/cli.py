"""``rlwb``: the workbench from the command line.

    rlwb up                 the workbench on embedded defaults (SQLite, no broker server):
                            migrations, a worker and a chat worker (child processes), the UI
    rlwb worker [ARGS]      a GPU worker (celery worker --pool threads -c 1 -Q gpu ARGS)
    rlwb worker --interactive   a worker for Playground chat (queue interactive)
    rlwb ui                 the UI alone (jobs go to the queue)
    rlwb db upgrade         migrate the database (DATABASE_URL, else the SQLite file)
    rlwb train CONFIG       run a training job here, without UI or queue, writing to the DB
    rlwb submit CONFIG      queue a job for the workers and print its id
    rlwb jobs               list the jobs
    rlwb resume JOB_ID      queue a failed or cancelled train job again, from its newest version
    rlwb cancel JOB_ID      cancel a job
    rlwb audit JOB_ID [--samples N]   re-score stored samples under their versions' weights

Environment: DATABASE_URL, REDIS_URL, RLWB_DATA_DIR (see workers/README.md).
"""

import argparse
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from workers import cli_audit, cli_jobs

WORKER_ARGS = ["--pool=threads", "--concurrency=1", "--queues=gpu"]
# Playground turns: short, two at a time, never behind a training job.
INTERACTIVE_ARGS = ["--pool=threads", "--concurrency=2", "--queues=interactive"]
EMBEDDED_ARGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
STOP_TIMEOUT_S = 90


def _auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("--auth must be USER:PASSWORD")
    return user, password


def _ui_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to serve the UI on")
    parser.add_argument("--port", type=int, default=7860, help="UI port (default 7860)")
    parser.add_argument(
        "--auth",
        type=_auth,
        default=_auth(os.environ.get("RLWB_AUTH")),
        help="USER:PASSWORD required by the UI (default: RLWB_AUTH, else none)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --host without a password (only where that address is "
        "private, e.g. a container whose port is published on the host's 127.0.0.1)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlwb", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="migrations, workers (child processes) and the UI")
    _ui_options(up)
    up.add_argument("--no-ui", action="store_true", help="run the worker only")
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
    _ui_options(commands.add_parser("ui", help="serve the UI (needs ui.app)"))
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
    cli_jobs.add_commands(commands)
    cli_audit.add_command(commands)
    return parser


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


def launch_ui(args: argparse.Namespace) -> bool:
    """Serve the UI if `ui.app` exists (blocks); False when it does not."""
    if importlib.util.find_spec("ui.app") is None:
        return False
    launch = importlib.import_module("ui.app").launch
    launch(args.host, args.port, args.auth, allow_unauthenticated=args.allow_unauthenticated)
    return True


def _stop(child: subprocess.Popen) -> None:
    """Warm shutdown of the worker (its job goes back to the queue), then kill."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_up(args: argparse.Namespace) -> int:
    from db import migrate
    from workers.settings import Settings

    problem = None if args.no_ui else _exposure(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    settings = Settings.from_env()
    migrate.upgrade()
    broker = "embedded (filesystem)" if settings.embedded else "Redis"
    print(f"data: {settings.data_dir}; broker: {broker}", flush=True)
    child = subprocess.Popen([sys.executable, "-m", "workers", "worker"])
    chat = subprocess.Popen([sys.executable, "-m", "workers", "worker", "--interactive"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the children on the way out
    try:
        if args.no_ui:
            return child.wait()
        if not launch_ui(args):
            print("The UI is not available (no ui.app); running the worker only.", flush=True)
            return child.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(chat)
        _stop(child)


def _exposure(args: argparse.Namespace) -> str | None:
    from workers.exposure import exposure_problem

    return exposure_problem(args.host, args.auth, allow_unauthenticated=args.allow_unauthenticated)


def run_ui(args: argparse.Namespace) -> int:
    problem = _exposure(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if not launch_ui(args):
        print("The UI is not available (no ui.app).", file=sys.stderr)
        return 1
    return 0


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
    from workers.jobs import run_job
    from workers.settings import Settings
    from workers.specs import validate
    from workers.storage import repository

    config = cli_jobs.read_config(path)
    total_steps = validate("train", config)
    migrate.upgrade()
    repo = repository()
    job = repo.create_job("train", config, total_steps=total_steps)
    print(f"job {job.id}", flush=True)
    outcome = run_job(repo, job.id, Settings.from_env(), progress=_print_progress)
    print(f"job {job.id} {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))
    return 0 if outcome.status == "succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    """The ``rlwb`` console script."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "worker":
        return run_worker(extra, args.interactive)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "up":
        return run_up(args)
    if args.command == "ui":
        return run_ui(args)
    if args.command in cli_jobs.JOB_COMMANDS:
        return cli_jobs.run(args)
    if args.command == "audit":
        return cli_audit.run(args)
    if args.command == "db":
        from db import migrate

        migrate.upgrade(None, args.revision)
        return 0
    return run_train(args.config)


if __name__ == "__main__":
    sys.exit(main())
