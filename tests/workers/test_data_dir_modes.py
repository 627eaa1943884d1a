"""The data directory, the databases and the embedded broker's files are for this user alone
(issue 32, item 6): under the usual umask they were readable by every local user (0755 and
0644)."""

import os
import stat
import uuid

from kombu import Connection

from db import Repository, upgrade
from workers.app import broker_settings
from workers.settings import Settings


def test_a_fresh_data_dir_and_everything_in_it_is_for_this_user_alone(tmp_path, monkeypatch):
    home = tmp_path / "home"  # missing too: created on the way to the data dir
    monkeypatch.setenv("RLWB_DATA_DIR", str(home / "data"))
    monkeypatch.delenv("DATABASE_URL", raising=False)  # the SQLite file in the data dir
    monkeypatch.delenv("REDIS_URL", raising=False)  # the embedded broker
    queue = f"modes-{uuid.uuid4().hex}"
    umask = os.umask(0o022)  # the usual one, whatever this runner's is
    try:
        upgrade()
        repo = Repository.from_url()
        repo.create_job("train", {"model": "demo"})  # a write: SQLite's WAL and index files
        options = broker_settings(Settings.from_env())["broker_transport_options"]
        with Connection(
            "filesystem://",
            transport="workers.embedded_broker:Transport",
            transport_options=options,
        ) as connection:
            # a queue of its own: kombu writes the exchange table of a binding new to it
            connection.SimpleQueue(queue).put({"job": 1})
        modes = {
            str(path.relative_to(home)): stat.S_IMODE(path.stat().st_mode)
            for path in home.rglob("*")
        }
        repo.close()
    finally:
        os.umask(umask)

    assert {"data/rlwb.db", "data/rlwb.db-wal", "data/celery-results.db"} <= set(modes)
    assert f"data/broker/control/{queue}.exchange" in modes
    assert any(name.endswith(f".{queue}.msg") for name in modes)
    folders = {name for name in modes if (home / name).is_dir()}
    assert {name: modes[name] for name in folders} == dict.fromkeys(folders, 0o700)
    files = set(modes) - folders
    assert {name: modes[name] for name in files} == dict.fromkeys(files, 0o600)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
