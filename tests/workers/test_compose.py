"""docker-compose.yml is valid for both worker profiles (no Docker engine needed), its
services run a job as plain processes here, and the image installs what the README says."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.workers.compose import Rehearsal
from tests.workers.helpers import wait_for
from tests.workers.served import table_rows, ui_client

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


def test_the_image_installs_what_the_readme_documents():
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    [run] = [line for line in dockerfile.splitlines() if re.match(r"RUN .*pip install", line)]
    image = re.search(r"pip install [^&;]+", run).group(0).strip()
    documented = re.findall(r"`(pip install [^`]+)`", (ROOT / "README.md").read_text())
    assert image in documented, f"the Dockerfile runs `{image}`; the README says {documented}"


@pytest.mark.slow
def test_compose_up_as_plain_processes_runs_a_job_launched_from_the_ui(
    redis_url, postgres_schemas, tiny_model, tmp_path
):
    """`tests.workers.compose`: docker-compose.yml's own services on the real Redis and
    PostgreSQL here, migrations first; every health check passes, the Launch tab lists the
    checkpoint under the mounted /models, and a job launched there succeeds."""
    database = postgres_schemas.create().render_as_string(hide_password=False)
    local = {"redis": redis_url, "postgres": database}
    models = {"RLWB_MODELS": str(Path(tiny_model).parent)}  # bind-mounted at /models
    rehearsal = Rehearsal(ROOT / "docker-compose.yml", local, tmp_path, models)
    assert rehearsal.infrastructure == set(local)
    assert rehearsal.order()[0] == "migrate"
    with rehearsal.up():
        [port] = rehearsal.ports.values()
        client = ui_client(port, rehearsal.processes["ui"])
        for name, service in rehearsal.services.items():
            if service.healthcheck:
                wait_for(lambda n=name: rehearsal.healthy(n), 120, f"{name} healthy", interval=3)
        choices, _ = client.predict(api_name="/launch_rescan")
        assert tiny_model in [value for _, value in choices["choices"]]
        # a random model's first letter matches half the time: groups with reward variance
        form = {"task": "always7", "data": None, "reward": "regex:[a-zA-Z].*", "steps": 2}
        form.update(batch_size=2, group_size=4, max_tokens=4, heldout_every=0)
        message = client.predict(model=tiny_model, **form, api_name="/launch")
        queued = re.match(r"Job \*\*#(\d+)\*\* is queued", message)
        assert queued and "No worker is online" not in message, message
        job_id = int(queued.group(1))

        def status() -> str:
            jobs = table_rows(client.predict(api_name="/jobs"))
            return next(row["status"] for row in jobs if row["job"] == job_id)

        wait_for(lambda: status() in ("succeeded", "failed"), 120, "the job", interval=1)
        assert status() == "succeeded", rehearsal.log("worker")
