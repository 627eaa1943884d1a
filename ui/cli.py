"""``rlwb``: the workbench from the command line (the composition root).

    rlwb up                 the workbench on embedded defaults (SQLite, no broker server):
                            migrations, a worker and a chat worker (child processes, started
                            again if they die: `ui.supervise`), the UI
    rlwb ui                 migrate the database, then serve the UI (jobs go to the queue)
    rlwb worker [ARGS]      a GPU worker gpu@%h (celery worker --pool threads -c 1 -Q gpu ARGS)
    rlwb worker --interactive   a worker for Playground chat chat@%h (queue interactive)
    rlwb db upgrade         migrate the database (DATABASE_URL, else the SQLite file)
    rlwb train CONFIG       run a training job here, without UI or queue, writing to the DB
    rlwb submit CONFIG      queue a job for the workers and print its id
    rlwb jobs               list the jobs
    rlwb resume JOB_ID      requeue a failed, stalled, pruned or cancelled train job
    rlwb cancel JOB_ID      cancel a job
    rlwb audit JOB_ID       re-score stored samples under their versions' kept weights
    rlwb export JOB_ID VERSION DIR [--merged]   a version's adapter, merged model or checkpoint
    rlwb study run FILE | status|cancel|resume NAME | clone NAME NEW   a study (docs/studies.md)

``up`` and ``ui`` live here; the others are `workers.commands`. Environment: DATABASE_URL,
REDIS_URL, RLWB_DATA_DIR, RLWB_AUTH (USER:PASSWORD for the UI; see docs/operations.md).
"""

import argparse
import os
import signal
import sys
import threading
from functools import partial

from db import upgrade
from ui.supervise import Supervised
from workers import api


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """``user:pass`` as a pair; None for no password."""
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("--auth must be USER:PASSWORD")
    return user, password


def _ui_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to serve the UI on")
    parser.add_argument("--port", type=int, default=7860, help="UI port (default 7860)")
    parser.add_argument(
        "--auth",
        type=parse_auth,
        default=os.environ.get("RLWB_AUTH"),  # argparse runs string defaults through type
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
    ui = commands.add_parser("ui", help="migrate the database, then serve the UI")
    _ui_options(ui)
    ui.add_argument("--share", action="store_true", help="also open a public share link")
    api.add_worker_commands(commands)
    return parser


def _exposure(args: argparse.Namespace) -> str | None:
    share = getattr(args, "share", False)
    return api.exposure_problem(args.host, args.auth, share, args.allow_unauthenticated)


def serve(args: argparse.Namespace) -> None:
    """Serve the UI as ``args`` say (blocks)."""
    from ui.app import launch

    launch(
        host=args.host,
        port=args.port,
        auth=args.auth,
        share=getattr(args, "share", False),
        allow_unauthenticated=args.allow_unauthenticated,
    )


def run_ui(args: argparse.Namespace) -> int:
    problem = _exposure(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    upgrade()
    serve(args)
    return 0


def run_up(args: argparse.Namespace) -> int:
    problem = None if args.no_ui else _exposure(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    upgrade()
    print(api.deployment(), flush=True)
    workers = Supervised(
        {
            "gpu": [sys.executable, "-m", "workers", "worker"],
            "chat": [sys.executable, "-m", "workers", "worker", "--interactive"],
        }
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the children on the way out
    try:
        if args.no_ui:
            threading.Event().wait()  # until SIGTERM or Ctrl-C
        serve(args)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        workers.stop()


def main(argv: list[str] | None = None) -> int:
    """The ``rlwb`` console script."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return api.guarded(partial(_dispatch, args, extra))


def _dispatch(args: argparse.Namespace, extra: list[str]) -> int:
    if args.command == "up":
        return run_up(args)
    if args.command == "ui":
        return run_ui(args)
    return api.run_worker_command(args, extra)
