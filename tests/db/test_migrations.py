import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import URL

from db import downgrade, make_engine, upgrade
from db.__main__ import main
from db.migrate import heads
from db.models import Base

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLES = {"jobs", "policy_versions", "rollout_batches", "samples", "version_sample_stats"}


def _differences(url: URL) -> list:
    engine = make_engine(url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    return differences


def _tables(url: URL) -> set[str]:
    engine = make_engine(url)
    names = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    return names


def test_single_head() -> None:
    assert len(heads()) == 1


def test_upgrade_matches_the_models(empty_database_url: URL) -> None:
    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []


def test_downgrade_to_base_and_upgrade_again(empty_database_url: URL) -> None:
    upgrade(empty_database_url)
    downgrade(empty_database_url, "base")
    assert _tables(empty_database_url) == {"alembic_version"}
    upgrade(empty_database_url)
    assert _tables(empty_database_url) == TABLES | {"alembic_version"}
    assert _differences(empty_database_url) == []


def _indexes(url: URL, table: str) -> dict[str, list[str]]:
    engine = make_engine(url)
    indexes = {i["name"]: i["column_names"] for i in sa.inspect(engine).get_indexes(table)}
    engine.dispose()
    return indexes


def test_downgrade_0002_restores_the_batch_index(empty_database_url: URL) -> None:
    upgrade(empty_database_url)
    assert _indexes(empty_database_url, "samples")["ix_samples_batch_version"] == [
        "batch_id",
        "policy_version",
        "id",
    ]
    downgrade(empty_database_url, "0001")
    samples = _indexes(empty_database_url, "samples")
    assert samples["ix_samples_batch_id"] == ["batch_id"]
    assert "ix_samples_batch_version" not in samples
    assert "ix_rollout_batches_job_order" not in _indexes(empty_database_url, "rollout_batches")
    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []


def test_command_line_upgrades_the_database_url(empty_database_url: URL, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", empty_database_url.render_as_string(hide_password=False))
    main(["upgrade"])
    assert _tables(empty_database_url) >= TABLES
    main(["downgrade", "base"])
    assert TABLES.isdisjoint(_tables(empty_database_url))


def test_python_dash_m_db_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    subprocess.run([sys.executable, "-m", "db", "--url", url, "upgrade"], cwd=REPO_ROOT, check=True)
    assert _tables(sa.make_url(url)) >= TABLES
