"""Job configs are checked before they are queued, and the UI-facing modules import no torch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.specs import SpecError, compare_spec, evaluate_spec, validate

ROOT = Path(__file__).resolve().parents[2]


def test_train_configs_are_checked_with_the_trainer_rules():
    assert validate("train", {"model": "m", "task": "always7", "steps": 7}) == 7
    with pytest.raises(SpecError, match="exactly one of 'task' or 'data'"):
        validate("train", {"model": "m"})
    with pytest.raises(SpecError, match="unknown config keys"):
        validate("train", {"model": "m", "task": "always7", "stepz": 1})
    with pytest.raises(SpecError, match="kv_strategy must be one of paged, contiguous"):
        validate("train", {"model": "m", "task": "always7", "kv_strategy": "radix"})


def test_evaluate_and_compare_configs():
    spec = evaluate_spec({"job_id": 1, "version": 2, "task": "addition", "num_prompts": 5})
    assert (spec.job_id, spec.version, spec.eval.num_prompts, spec.eval.temperature) == (
        1,
        2,
        5,
        0.0,
    )
    assert compare_spec({"job_id": 1, "versions": [3, 1], "task": "always7"}).versions == (3, 1)
    assert validate("compare", {"job_id": 1, "versions": [0, 1], "task": "always7"}) == 2
    for kind, config, message in [
        ("evaluate", {"version": 1, "task": "always7"}, "either 'model' or 'job_id'"),
        ("evaluate", {"job_id": 1, "task": "always7"}, "needs a 'version'"),
        ("compare", {"job_id": 1, "versions": [2, 2], "task": "always7"}, "two different"),
        ("compare", {"versions": [1, 2], "task": "always7"}, "missing config keys"),
        ("compare", {"job_id": 1, "versions": [1, 2]}, "exactly one of 'task' or 'data'"),
        ("evaluate", {"model": "m", "task": "always7", "count": 3}, "unknown config keys"),
        ("evaluate", {"model": "m", "task": "always7", "reward": "regex:("}, "invalid regular"),
        ("train", {"model": "m", "task": "always7", "reward": "os:system"}, "not allowed"),
    ]:
        with pytest.raises(SpecError, match=message):
            validate(kind, config)
    with pytest.raises(ValueError):
        validate("dance", {})


def test_the_api_and_the_app_import_no_torch(tmp_path):
    code = (
        "import sys, workers.api, workers.app, workers.tasks, workers.jobs, workers.commands;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "RLWB_DATA_DIR": str(tmp_path)}
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
