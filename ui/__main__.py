"""``python -m ui [--host H] [--port P] [--share] [--auth user:pass]``: migrate the database
(``DATABASE_URL``, else the SQLite file in ``RLWB_DATA_DIR``) to the latest schema, then serve
the UI, with jobs going to the queue through `workers.api`.

The password may also come from ``RLWB_AUTH`` (``user:pass``).
"""

import argparse
import os

from db import upgrade
from ui.app import launch
from workers import api


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """``user:pass`` as a pair; None for no password."""
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("expected user:pass")
    return user, password


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ui", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true", help="also open a public share link")
    parser.add_argument(
        "--auth",
        type=parse_auth,
        default=os.environ.get("RLWB_AUTH"),  # argparse runs string defaults through type
        help="require a login, user:pass (default: RLWB_AUTH)",
    )
    args = parser.parse_args(argv)
    problem = api.exposure_problem(args.host, args.auth, args.share)
    if problem:
        parser.error(problem)
    upgrade()
    launch(host=args.host, port=args.port, auth=args.auth, share=args.share)


if __name__ == "__main__":
    main()
