"""LoRA in the UI: the Launch toggle (LoRA's defaults, its learning rate, its problems from
`LoraSettings`), Clone, and a LoRA job trained for real (the worker's code, the tiny
checkpoint): its page shows the base's checksum and every version's adapter size, the CSV
each version's, and the Playground offers every version."""

import csv
import dataclasses
import os

import pytest

from tests.ui.test_launch import form
from tests.workers.helpers import train_config
from ui.handlers.clone import clone_form
from ui.handlers.export import metrics_csv
from ui.handlers.jobs import job_page
from ui.handlers.launch import launch_job, lr_for_mode
from ui.handlers.launch import train_config as form_config
from ui.handlers.playground import answerable_versions
from ui.render import inert
from workers.api import LAUNCH_DEFAULTS, LINEAR_MODULES, size_text
from workers.jobs import run_job
from workers.settings import Settings

STEPS = 4  # past the full-weight retention: a LoRA job keeps every version's adapter


@pytest.fixture(scope="module")
def lora_job(world, tmp_path_factory):
    from core_engine.toy import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("lora")
    model = save_tiny_checkpoint(world["model"].parent / "lora-base", arch="llama")
    lora = {"rank": 4, "alpha": 8}
    config = train_config(str(model), steps=STEPS, group_size=4, reward="regex:.*[a-z].*")
    repo = world["repo"]
    job = repo.create_job("train", {**config, "lora": lora}, total_steps=STEPS)
    settings = dataclasses.replace(Settings.from_env(), data_dir=root / "data")
    assert run_job(repo, job.id, settings).status == "succeeded"
    return repo.get_job(job.id)


def adapter_sizes(repo, job_id: int) -> list[int]:
    return [
        os.stat(f"{v.checkpoint_path}/adapter_model.safetensors").st_size
        for v in repo.list_versions(job_id)
    ]


def test_the_job_page_shows_the_base_checksum_and_each_versions_adapter(services, lora_job, job):
    sizes = adapter_sizes(services.repository, lora_job.id)
    assert len(sizes) == STEPS + 1 and len(set(sizes)) == 1  # one shape: one size
    summary = job_page(services, lora_job.id)[0]
    assert f"**LoRA** {inert('rank 4 · alpha 8')}" in summary
    assert f"base checksum `{lora_job.base_checksum[:16]}`" in summary
    kept = f"adapter {size_text(sizes[0])} per version, {STEPS + 1} of {STEPS + 1} versions kept"
    assert f"{kept} ({size_text(sum(sizes))})" in summary
    assert "**LoRA**" not in job_page(services, job.id)[0]  # a full-weight job

    with open(metrics_csv(services, lora_job.id), newline="") as file:
        rows = list(csv.DictReader(file))
    assert [int(row["adapter_bytes"]) for row in rows] == sizes


def test_the_playground_offers_every_version_of_a_lora_job(services, lora_job):
    versions = answerable_versions(services, lora_job.id)
    assert versions.answerable == list(range(STEPS + 1)) and versions.not_kept == 0


def test_launch_with_lora_sends_its_table_and_the_form_switches_the_learning_rate(services, world):
    on = {
        "lora": True,
        **{name: LAUNCH_DEFAULTS[name] for name in LAUNCH_DEFAULTS if name.startswith("lora_")},
    }
    assert on["lora_rank"] == 16 and on["lora_alpha"] == 32 and on["lora_dropout"] == 0
    assert "is queued" in launch_job(services, **form(**on))
    lora = world["queue"].submitted[-1][1]["lora"]
    assert lora == {"rank": 16, "alpha": 32, "dropout": 0, "target_modules": "all-linear"}

    picked = {
        **on,
        "lora_target_modules": ["q_proj", "v_proj"],
        "lora_modules_to_save": ["lm_head"],
    }
    launch_job(services, **form(**picked))
    lora = world["queue"].submitted[-1][1]["lora"]
    assert lora["target_modules"] == ["q_proj", "v_proj"] and lora["modules_to_save"] == ["lm_head"]
    assert "lora" not in form_config(services, **form())

    assert LAUNCH_DEFAULTS["lr"] == 3e-4 and lr_for_mode(True, 3e-4) == 3e-3
    assert lr_for_mode(False, 3e-3) == 3e-4 and lr_for_mode(True, 0.01) == 0.01  # the user's
    assert lr_for_mode(True, None) == 3e-3


def test_the_lora_learning_rate_default_follows_the_models_size(tmp_path):
    """The 10x rule is for billion-scale models: on the shipped 527k-parameter demo policy it
    collapsed training, so below 100M parameters the LoRA default is 1e-3, in the form and
    in a job file that leaves lr out."""
    import json

    from core_engine.rl.config import GRPOConfig
    from workers.api import DEMO_MODEL
    from workers.job_files import resolve_model

    assert lr_for_mode(True, 3e-4, DEMO_MODEL) == 1e-3
    assert lr_for_mode(False, 1e-3, DEMO_MODEL) == 3e-4
    big = tmp_path / "big"
    big.mkdir()
    shape = {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864}
    (big / "config.json").write_text(json.dumps({**shape, "vocab_size": 151936}))
    assert lr_for_mode(True, 3e-4, str(big)) == 3e-3  # a Qwen2.5-0.5B shape
    small = GRPOConfig(model=resolve_model(DEMO_MODEL), output_dir="o", task="addition", lora={})
    assert small.lr == 1e-3
    assert GRPOConfig(model=str(big), output_dir="o", task="addition", lora={}).lr == 3e-3


def test_invalid_lora_settings_are_refused_with_what_is_wrong(services, world):
    bad = {"lora": True, "lora_rank": 0, "lora_alpha": 32, "lora_dropout": 1.0}
    message = launch_job(services, **form(**bad, lora_target_modules=[]))
    assert message.startswith("**Nothing was enqueued.**")
    for problem in (
        "rank must be an integer from 1 to 1024, got 0",
        "dropout must be in [0, 1), got 1.0",
        "target_modules must be 'all-linear' or a list of distinct names",
    ):
        assert inert(problem) in message
    message = launch_job(services, **form(**{**bad, "lora_rank": 2.5, "lora_dropout": 0}))
    assert inert("rank must be an integer from 1 to 1024, got 2.5") in message
    message = launch_job(services, **form(**{**bad, "lora_rank": 4, "lora_alpha": "x"}))
    assert inert("lora alpha: 'x' is not a number") in message
    assert world["queue"].submitted == []


def test_clone_fills_lora_and_the_learning_rate_the_job_ran_with(services, lora_job, job):
    values, _ = clone_form(services, lora_job.id)
    assert values["lora"] is True and (values["lora_rank"], values["lora_alpha"]) == (4, 8)
    assert values["lora_target_modules"] == list(LINEAR_MODULES)
    assert values["lr"] == 3e-3  # not set: LoRA's default
    config = form_config(services, **values)
    assert config["lora"] == {
        **lora_job.config["lora"],
        "dropout": 0,
        "target_modules": "all-linear",
    }

    repo = services.repository
    model = job.config["model"]
    full = repo.create_job("train", {"model": model, "task": "always7"})
    assert clone_form(services, full.id)[0]["lr"] == 3e-4
    assert clone_form(services, full.id)[0]["lora"] is False
    picked = {"target_modules": ["down_proj"], "modules_to_save": ["lm_head"], "dropout": 0.1}
    some = repo.create_job("train", {"model": model, "task": "always7", "lora": picked})
    values = clone_form(services, some.id)[0]
    assert values["lora_target_modules"] == ["down_proj"] and values["lora_dropout"] == 0.1
    assert values["lora_modules_to_save"] == ["lm_head"] and values["lora_rank"] == 16
