"""What ``rlwb`` says when it cannot work for a reason its user can fix: one line on stderr and
status 1, never a traceback. The database is not set up (no tables yet: ``rlwb db upgrade``)
or cannot be reached, or a file or directory it needs cannot be used (the data directory not
writable, a port taken)."""

import sys
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from db import resolve_url

UNDEFINED_TABLE = "42P01"  # PostgreSQL's SQLSTATE for a table that does not exist


def database_problem(exc: DBAPIError) -> str:
    """What is wrong with the database, in one line (its URL without the password)."""
    url = resolve_url().render_as_string(hide_password=True)
    cause = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
    missing = getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE or "no such table" in cause
    if missing:
        return (
            f"the database {url} is not set up ({cause}): run `rlwb db upgrade` first "
            "(`rlwb up` and `rlwb ui` do it)"
        )
    return f"cannot use the database {url}: {cause}"


def guarded(command: Callable[[], int]) -> int:
    """``command()``'s status, or 1 with one line on stderr for the errors above."""
    try:
        return command()
    except DBAPIError as exc:
        print(f"rlwb: {database_problem(exc)}", file=sys.stderr)
    except OSError as exc:
        print(f"rlwb: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1
