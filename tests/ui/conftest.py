"""Fixtures of the UI tests: a temporary database with realistic rows and a fake queue."""

import warnings
from pathlib import Path

import pytest
from pandas.errors import Pandas4Warning

from db import JobInfo, Repository, upgrade
from tests.ui.helpers import FakeQueue, fill_training_job, save_tokenizer
from ui.services import Services


@pytest.fixture(autouse=True)
def _quiet_pandas():
    """gradio 6.31's queue converts returned DataFrames with options pandas 3 deprecates."""
    warnings.filterwarnings("ignore", category=Pandas4Warning)


def new_repository(folder: Path) -> Repository:
    url = f"sqlite+pysqlite:///{folder / 'rlwb.db'}"
    upgrade(url)
    return Repository.from_url(url)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A database with a finished train job (4 versions, accepted and rejected batches), a
    model root holding its tokenizer checkpoint, and a fake queue."""
    root = tmp_path_factory.mktemp("ui")
    models = root / "models"
    model_dir = save_tokenizer(models / "tiny")
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"")
    repo = new_repository(root)
    job = fill_training_job(repo, model_dir)
    queue = FakeQueue(repo)
    services = queue.services((models,), root / "data")
    yield {"repo": repo, "job": job, "queue": queue, "services": services, "model": model_dir}
    repo.close()


@pytest.fixture
def services(world) -> Services:
    world["queue"].submitted.clear()
    world["queue"].studies.clear()
    return world["services"]


@pytest.fixture
def job(world) -> JobInfo:
    return world["job"]
