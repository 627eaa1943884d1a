"""Hugging Face Hub ids as models (issue 32): what users type. With a network (here a stand-in
Hub on 127.0.0.1, ``HF_ENDPOINT``) the worker downloads the model once into the Hugging Face
cache, the download's progress shown as the job's phase; offline (``HF_HUB_OFFLINE=1``) a model
the cache does not hold is refused, saying so, at submission and by the worker."""

import json
import os
import subprocess
import sys
from pathlib import Path

from huggingface_hub import constants

from db import JobStatus, Repository
from tests.workers.fake_hub import COMMIT, FakeHub, serving
from tests.workers.helpers import train_config
from tests.workers.stack import ROOT
from workers.hub import is_hub_id
from workers.jobs import run_job

HUB_ID = "tiny-org/tiny-llama"
REFUSED = (
    "model: {model} is a Hugging Face Hub id and is not in this machine's Hugging Face cache "
    "({cache}), and HF_HUB_OFFLINE is set, so nothing is downloaded: download it where there "
    "is a network (`hf download {model}`, into the same cache), or let the worker download "
    "it: start it with HF_HUB_OFFLINE=0 (`make up` sets HF_HUB_OFFLINE=1: "
    "`make up HF_HUB_OFFLINE=0`)"
)


def _rlwb(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``rlwb ARGS`` with a data dir, a database and a Hugging Face cache of the test's own."""
    environment = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    environment.update(
        RLWB_DATA_DIR=str(tmp_path / "data"),
        HF_HOME=str(tmp_path / "hf"),
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        **env,
    )
    argv = [sys.executable, "-m", "ui", *args]
    return subprocess.run(argv, cwd=tmp_path, env=environment, capture_output=True, text=True)


def _job_file(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(train_config(model, steps=1)))
    return path


def test_hub_ids_are_told_from_local_paths(tmp_path, monkeypatch):
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("tiny-org/tiny-llama")
    for local in ("demo", "core_engine/assets/demo-policy", "/models/qwen", "a--b/c", "a/../b"):
        assert not is_hub_id(local), local
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("models/qwen")  # a local folder of that name is the local folder


def test_offline_a_hub_model_not_in_the_cache_is_refused_at_submission(tmp_path):
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    assert _rlwb(tmp_path, "db", "upgrade").returncode == 0
    done = _rlwb(tmp_path, "submit", str(_job_file(tmp_path, model)), HF_HUB_OFFLINE="1")
    assert done.returncode == 1, done.stderr
    cache = tmp_path / "hf" / "hub"
    assert done.stdout == "refused: " + REFUSED.format(model=model, cache=cache) + "\n"
    assert _rlwb(tmp_path, "jobs").stdout.startswith("no jobs yet")  # nothing was queued


def test_offline_the_worker_refuses_a_queued_hub_model_not_in_its_cache(
    repo, settings, tmp_path, monkeypatch
):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    job = repo.create_job("train", train_config(HUB_ID), total_steps=3)  # queued while online
    outcome = run_job(repo, job.id, settings, queued=True)
    assert outcome.status == "failed"
    cache = tmp_path / "hub"
    assert outcome.error == "HubModelUnavailable: " + REFUSED.format(model=HUB_ID, cache=cache)


def test_a_hub_model_is_downloaded_once_its_progress_the_jobs_phase(tmp_path, tiny_model):
    hub = FakeHub(HUB_ID, Path(tiny_model))
    size = sum(len(data) for data in hub.files.values())
    job_file = _job_file(tmp_path, HUB_ID)
    with serving(hub) as endpoint:
        online = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"}
        first = _rlwb(tmp_path, "train", str(job_file), **online)
        assert first.returncode == 0, first.stdout + first.stderr
        assert hub.served == dict.fromkeys(hub.files, 1)
        second = _rlwb(tmp_path, "train", str(job_file), **online)
        assert second.returncode == 0, second.stdout + second.stderr
        assert hub.served == dict.fromkeys(hub.files, 1)  # from the cache: nothing fetched
    phases = [line for line in first.stdout.splitlines() if line.startswith("downloading")]
    assert phases[0] == f"downloading {HUB_ID} from the Hugging Face Hub"
    assert phases[-1] == f"{phases[0]}: {size:,} bytes of {size:,} bytes"
    assert "downloading" not in second.stdout
    snapshot = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT
    repo = Repository.from_url(f"sqlite:///{tmp_path / 'data' / 'rlwb.db'}")
    try:
        for job in repo.list_jobs():
            assert job.status is JobStatus.SUCCEEDED and job.config["model"] == HUB_ID
            assert repo.get_version(job.id, 0).checkpoint_path == str(snapshot)
    finally:
        repo.close()


def test_a_hub_id_the_hub_does_not_know_fails_the_job_saying_so(tmp_path, tiny_model):
    missing = "tiny-org/no-such-model"
    with serving(FakeHub(HUB_ID, Path(tiny_model))) as endpoint:
        done = _rlwb(
            tmp_path,
            "train",
            str(_job_file(tmp_path, missing)),
            HF_ENDPOINT=endpoint,
            HF_HUB_OFFLINE="0",
        )
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"job 1 failed: HubModelUnavailable: model: {missing}: no such model on the Hugging "
        "Face Hub (or it is private or gated: set HF_TOKEN to a token that may read it)"
    )


# Issue 45, item 7: a download is bounded by the repository's listed size, checked first.
def test_a_hub_model_larger_than_the_download_limit_is_refused_before_any_file_is_fetched(
    tmp_path, tiny_model
):
    hub = FakeHub(HUB_ID, Path(tiny_model))
    size = sum(len(data) for data in hub.files.values())
    with serving(hub) as endpoint:
        done = _rlwb(
            tmp_path,
            "train",
            str(_job_file(tmp_path, HUB_ID)),
            HF_ENDPOINT=endpoint,
            HF_HUB_OFFLINE="0",
            RLWB_MAX_DOWNLOAD_BYTES=str(size - 1),
        )
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"job 1 failed: HubModelUnavailable: model: {HUB_ID}: its checkpoint files on the "
        f"Hugging Face Hub take {size:,} bytes, over the {size - 1:,} bytes a download may "
        "take (RLWB_MAX_DOWNLOAD_BYTES)"
    )
    assert not hub.served  # nothing was fetched
