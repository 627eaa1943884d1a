"""One `Repository` per process and database URL (``DATABASE_URL``, else the SQLite file)."""

import functools

from db import Repository, resolve_url


@functools.cache
def _repository(url: str) -> Repository:
    return Repository.from_url(url)


def repository() -> Repository:
    """The repository of the database the environment names now."""
    return _repository(resolve_url().render_as_string(hide_password=False))
