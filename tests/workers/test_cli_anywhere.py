"""``rlwb`` run outside the repository (issue 32): its data go to one directory per user, never
the working directory, and what the user can fix (a database not set up or out of reach) is one
line, without a traceback."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNSET = ("RLWB_DATA_DIR", "DATABASE_URL", "REDIS_URL", "XDG_DATA_HOME")


def _rlwb(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``rlwb ARGS`` in ``cwd`` with a home of its own and none of the workbench's settings."""
    environment = {k: v for k, v in os.environ.items() if k not in UNSET}
    environment.update(HOME=str(cwd / "home"), PYTHONPATH=str(ROOT), **env)
    argv = [sys.executable, "-m", "ui", *args]
    return subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True)


def test_rlwb_outside_the_repository_keeps_its_data_per_user_and_says_what_to_do(tmp_path):
    first = _rlwb(tmp_path, "jobs")
    database = tmp_path / "home" / ".local" / "share" / "rlwb" / "rlwb.db"
    assert first.returncode == 1
    assert first.stderr == (
        f"rlwb: the database sqlite+pysqlite:///{database} is not set up (no such table: "
        "jobs): run `rlwb db upgrade` first (`rlwb up` and `rlwb ui` do it)\n"
    )
    assert _rlwb(tmp_path, "db", "upgrade").returncode == 0
    listed = _rlwb(tmp_path, "jobs")
    assert (listed.returncode, listed.stderr) == (0, "") and listed.stdout.startswith("no jobs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no ./data

    elsewhere = tmp_path / "xdg"
    assert _rlwb(tmp_path, "db", "upgrade", XDG_DATA_HOME=str(elsewhere)).returncode == 0
    assert (elsewhere / "rlwb" / "rlwb.db").is_file()


def test_a_database_out_of_reach_is_one_line(tmp_path):
    url = "postgresql://rlwb:secret@127.0.0.1:1/rlwb"  # nothing listens on port 1
    done = _rlwb(tmp_path, "jobs", DATABASE_URL=url)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "rlwb: cannot use the database postgresql+psycopg://rlwb:***@127.0.0.1:1/rlwb: "
    )
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
