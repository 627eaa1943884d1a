"""docker-compose.yml is valid for both worker profiles (no Docker engine needed)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"redis", "postgres", "migrate", "worker", "worker-interactive", "ui"}


@pytest.fixture
def compose() -> list[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        message = "docker-compose is not installed (apt-get install docker-compose)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; required because CI=true", pytrace=False)
        pytest.skip(message)
    return [binary, "--project-directory", str(ROOT), "-f", str(ROOT / "docker-compose.yml")]


def _run(argv: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_PASSWORD", "RLWB_AUTH")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_plain_up_runs_a_worker_and_gpu_is_a_profile(compose):
    _run([*compose, "config", "-q"])
    services = yaml.safe_load(_run([*compose, "--profile", "gpu", "config"]))["services"]
    assert {name for name, s in services.items() if not s.get("profiles")} == SERVICES
    assert services["worker-gpu"]["profiles"] == ["gpu"]


def test_worker_and_ui_share_checkpoints_and_see_the_models(compose):
    config = yaml.safe_load(_run([*compose, "--profile", "gpu", "config"]))
    services = config["services"]
    for name in ("worker", "worker-gpu", "worker-interactive", "ui"):
        mounts = {tuple(v.split(":")[:2]) for v in services[name]["volumes"]}
        assert ("rlwb-data", "/data") in mounts
        assert any(target == "/models" for _, target in mounts)
        assert services[name]["environment"]["RLWB_MODEL_ROOTS"] == "/models:/data"
    assert services["worker-gpu"]["environment"]["RLWB_DEVICE"] == "cuda"
    [port] = services["ui"]["ports"]
    assert port.startswith("127.0.0.1:")
