import math
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import URL

from db import (
    JobStatus,
    PolicyVersionRecord,
    Repository,
    SampleFilter,
    downgrade,
    make_engine,
    upgrade,
)
from db.__main__ import main
from db.errors import InvalidValue
from db.migrate import heads
from db.models import Base
from db.repository.studies import StudyJobRecord
from tests.db.helpers import make_batch, make_sample, running_job, sample_columns

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLES = {
    "jobs",
    "policy_versions",
    "rollout_batches",
    "samples",
    "studies",
    "version_sample_stats",
}


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


def test_0005_adds_stalled_and_its_downgrade_turns_stalled_jobs_into_failed_ones(
    empty_database_url: URL,
) -> None:
    reason = "every sample scored 0.0 in 6 batches: check the reward and the task"
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = repo.create_job("train", {})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0, None))
    assert repo.mark_stalled(job.id, reason).status is JobStatus.STALLED
    deleted = repo.create_job("train", {})
    repo.delete_job(deleted.id)
    repo.close()

    downgrade(empty_database_url, "0004")
    engine = make_engine(empty_database_url)
    statement = sa.text("SELECT status, error FROM jobs WHERE id = :id")
    with engine.connect() as connection:
        assert tuple(connection.execute(statement, {"id": job.id}).one()) == ("failed", reason)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(sa.text("UPDATE jobs SET status = 'stalled'"))
    engine.dispose()

    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []
    repo = Repository.from_url(empty_database_url)
    assert [v.version for v in repo.list_versions(job.id)] == [0]  # the copies lost nothing
    newer = repo.create_job("train", {})
    assert newer.id > deleted.id  # nor the id counter: a deleted job's id is never reused
    repo.mark_running(newer.id)
    assert repo.mark_stalled(newer.id, reason).status is JobStatus.STALLED
    repo.close()


def test_0006_adds_the_base_checksum_and_its_downgrade_keeps_the_jobs(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = repo.create_job("train", {"lora": {"rank": 4}})
    repo.mark_running(job.id)
    repo.record_base_checksum(job.id, "ab" * 32)
    deleted = repo.create_job("train", {})
    repo.delete_job(deleted.id)
    repo.close()

    downgrade(empty_database_url, "0005")
    engine = make_engine(empty_database_url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    assert "base_checksum" not in columns and "phase" in columns
    engine.dispose()

    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_job(job.id)
    assert kept.config == {"lora": {"rank": 4}} and kept.base_checksum is None
    assert repo.create_job("train", {}).id > deleted.id  # the id counter is kept
    repo.close()


def test_0007_adds_reward_components_and_its_downgrade_keeps_the_samples(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo)
    parts = {"math": 1.0, "format": 0.0}
    batch = repo.record_batch(make_batch(job.id, [make_sample(reward_components=parts)]))
    sample_id = repo.list_samples(SampleFilter(job_id=job.id)).items[0].id
    assert repo.get_sample(sample_id).reward_components == parts
    with pytest.raises(InvalidValue, match="reward_components"):
        repo.record_batch(make_batch(job.id, [make_sample(reward_components={"m": math.nan})]))
    repo.close()

    downgrade(empty_database_url, "0006")
    engine = make_engine(empty_database_url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("samples")}
    assert "reward_components" not in columns and "reward" in columns
    engine.dispose()

    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_sample(sample_id)
    assert kept.batch_id == batch.id and kept.reward == 1.0 and kept.reward_components is None
    repo.close()


def test_0012_adds_studies_and_pruned_and_its_downgrade_keeps_the_jobs(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    study = repo.create_study(
        "lr", "grid", {"steps": 2}, {"lr": [0.1]}, seeds=1, max_jobs=1, concurrency=1
    )
    made = StudyJobRecord({"steps": 2, "lr": 0.1, "seed": 0}, {"lr": 0.1})
    job = repo.schedule_study(study.id, lambda *_: [made])[1][0]
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0, None))
    assert repo.mark_pruned(job.id, "pruned at version 0").status is JobStatus.PRUNED
    deleted = repo.create_job("train", {})
    repo.delete_job(deleted.id)
    repo.close()

    downgrade(empty_database_url, "0011")
    engine = make_engine(empty_database_url)
    assert "studies" not in _tables(empty_database_url)
    statement = sa.text("SELECT status, error FROM jobs WHERE id = :id")
    with engine.connect() as connection:
        status, error = connection.execute(statement, {"id": job.id}).one()
    assert (status, error) == ("cancelled", "pruned at version 0")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(sa.text("UPDATE jobs SET status = 'pruned'"))
    engine.dispose()

    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_job(job.id)
    assert kept.config == made.config and kept.study_id is None
    assert [v.version for v in repo.list_versions(job.id)] == [0]
    assert repo.create_job("train", {}).id > deleted.id  # the id counter is kept
    repo.close()


def test_0013_adds_the_loss_record_and_its_downgrade_keeps_the_samples(
    empty_database_url: URL,
) -> None:
    upgrade(empty_database_url)
    repo = Repository.from_url(empty_database_url)
    job = running_job(repo)
    trained = [-0.25, -0.5, -0.75, -1.0]
    record = {
        "loss_ratios": [1.0, 1.25, 0.5, 1.0],
        "loss_weights": [1.0, 0.5, 0.0, 1.0],
        "loss_flags": [1, 1 | 2, 1 | 2 | 4, 0],
    }
    sample = make_sample(trainer_logprobs=trained, **record)
    batch = repo.record_batch(make_batch(job.id, [sample]))
    sample_id = repo.list_samples(SampleFilter(job_id=job.id)).items[0].id
    stored = repo.get_sample(sample_id)
    assert {name: getattr(stored, name) for name in record} == record
    for wrong, match in (
        ({**record, "loss_ratios": [1.0] * 3}, "loss_ratios: 3 values for 4 response tokens"),
        ({**record, "loss_flags": [8, 0, 0, 0]}, "loss_flags: expected LossFlag bits"),
        ({"loss_ratios": record["loss_ratios"]}, "go together"),
    ):
        with pytest.raises(InvalidValue, match=match):
            repo.record_batch(make_batch(job.id, [make_sample(trainer_logprobs=trained, **wrong)]))
    repo.close()

    downgrade(empty_database_url, "0012")
    assert not set(record) & sample_columns(empty_database_url)

    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []
    repo = Repository.from_url(empty_database_url)
    kept = repo.get_sample(sample_id)
    assert kept.batch_id == batch.id and kept.trainer_logprobs == trained
    assert kept.loss_flags is None and kept.loss_ratios is None
    repo.close()


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
