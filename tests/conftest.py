"""Suite-wide settings: one torch thread, offline hubs, deterministic seeds, and directories
of each test process's own.

`make test` runs the suite in pytest-xdist workers: every worker is a process of its own, with
its own Redis database (`tests.workers.stack.claim_redis`), PostgreSQL schemas
(`tests.db.conftest`), free ports and ``tmp_path``. A directory named by the environment would
be shared, since each worker inherits the environment of the controller that started it: the
ones below are made again in each process (the values a parent test process set are replaced).
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch

# The process whose directories the environment names (set with them, so inherited with them).
_OWNER = "RLWB_TESTS_PROCESS"
if os.environ.get(_OWNER) != str(os.getpid()):
    os.environ[_OWNER] = str(os.getpid())
    for _variable, _prefix in (
        # `workers.app` reads it when first imported: its embedded broker stays out of the
        # working tree (tests that need a data dir set their own with the `env` fixture)
        ("RLWB_DATA_DIR", "rlwb-tests-"),
        # where Gradio caches the files it serves (default: one /tmp/gradio for all processes)
        ("GRADIO_TEMP_DIR", "rlwb-tests-gradio-"),
    ):
        os.environ[_variable] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_variable], True)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In pytest-xdist's workers (`make test`), the `slow` tests are queued first (a stable
    sort: each group keeps its order), so that each starts while the short tests can still
    fill the other workers, instead of one running alone at the end."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
