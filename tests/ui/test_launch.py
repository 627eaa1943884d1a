"""Launch tab handlers: the form becomes a validated train config, or problems shown inline."""

import dataclasses
import json
import sys
from typing import Any

import pytest

from ui.handlers.launch import (
    JSONL_SOURCE,
    TASK_DEFAULT_REWARD,
    TASK_SOURCE,
    dataset_choices,
    launch_job,
    model_choices,
    upload_dataset,
)
from ui.render import inert
from workers.specs import DEMO_MODEL


def form(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model": DEMO_MODEL,
        "source": TASK_SOURCE,
        "task": "always7",
        "data": None,
        "reward": TASK_DEFAULT_REWARD,
        "steps": 3,
        "batch_size": 4,
        "group_size": 4,
        "lr": 3e-3,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 3,
        "max_policy_lag": 0,
        "kv_strategy": "paged",
        "clip_eps": 0.2,
        "kl_coef": 0.0,
        "seed": 0,
    }
    values.update(overrides)
    return values


def test_model_choices_offer_the_demo_and_checkpoints_under_the_roots(services, world):
    assert model_choices(services) == [
        ("built-in demo policy", DEMO_MODEL),
        (str(world["model"]), str(world["model"])),
    ]


def test_a_valid_form_enqueues_a_train_job(services, world):
    message = launch_job(services, **form(model=str(world["model"]), reward="regex:7.*"))
    assert "is queued: train" in message
    [(kind, config)] = world["queue"].submitted
    assert kind == "train"
    assert config == {
        "model": str(world["model"]),
        "task": "always7",
        "reward": "regex:7.*",
        "steps": 3,
        "batch_size": 4,
        "group_size": 4,
        "max_tokens": 3,
        "max_policy_lag": 0,
        "seed": 0,
        "updates_per_batch": 1,
        "lr": 3e-3,
        "temperature": 1.0,
        "top_p": 1.0,
        "clip_eps": 0.2,
        "kl_coef": 0.0,
        "kv_strategy": "paged",
    }
    assert isinstance(config["steps"], int) and config["reward"] == "regex:7.*"


def test_the_task_default_reward_is_left_to_the_task(services, world):
    launch_job(services, **form())
    assert world["queue"].submitted[0][1]["reward"] is None


def test_every_problem_is_reported_inline_and_nothing_is_enqueued(services, world):
    message = launch_job(
        services,
        **form(
            model="/etc",
            reward="regex:(",
            lr=None,
            steps=2.5,
            temperature="warm",
            kv_strategy="bogus",
        ),
    )
    assert message.startswith("**Nothing was enqueued.**")
    for problem in (
        "model: /etc is not under a model root",
        "reward:",
        "lr: required",
        "steps: a whole number is required",
        "temperature: 'warm' is not a number",
        "kv_strategy: choose one of paged, contiguous",
    ):
        assert inert(problem) in message  # shown as Markdown: made inert
    assert world["queue"].submitted == []


@pytest.mark.parametrize(
    "spec", ["os:system", "subprocess:run", "builtins:eval", "pty:spawn", "rlwb_ui_canary:fn"]
)
def test_a_reward_naming_code_is_refused_without_importing_it(services, world, tmp_path, spec):
    witness = tmp_path / "imported"
    (tmp_path / "rlwb_ui_canary.py").write_text(f"open({str(witness)!r}, 'w').close()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        message = launch_job(services, **form(reward=spec))
    finally:
        sys.path.remove(str(tmp_path))
    assert message.startswith("**Nothing was enqueued.**") and "not allowed" in message
    assert not witness.exists() and "rlwb_ui_canary" not in sys.modules
    assert world["queue"].submitted == []


def test_a_registered_reward_name_is_left_to_the_worker(services, world):
    launch_job(services, **form(reward="my_reward"))
    assert world["queue"].submitted[0][1]["reward"] == "my_reward"


def test_launch_warns_when_no_worker_is_online(services, world):
    assert "No worker is online" not in launch_job(services, **form())
    idle = dataclasses.replace(services, queue_overview=lambda: {"workers_online": 0})
    message = launch_job(idle, **form())
    assert message.startswith("Job **#") and "No worker is online" in message


def test_trainer_config_rules_are_reported_too(services, world):
    message = launch_job(services, **form(steps=0, top_p=1.5, group_size=0))
    assert inert("steps must be >= 1") in message and inert("group_size must be >= 1") in message
    assert inert("top_p must be in (0, 1]") in message
    assert world["queue"].submitted == []


def test_the_queue_refusing_a_config_is_reported(services):
    def refuse(kind, config):
        raise ValueError("queue says no")

    refusing = dataclasses.replace(services, submit_job=refuse)
    assert launch_job(refusing, **form()) == "**Nothing was enqueued:** queue says no"


def test_an_uploaded_jsonl_is_kept_and_can_be_launched(services, world, tmp_path):
    upload = tmp_path / "prompts.jsonl"
    upload.write_text(json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n")
    choices, stored, message = upload_dataset(services, str(upload))
    assert stored is not None and stored in choices and stored in dataset_choices(services)
    assert stored.startswith(str(services.data_dir / "datasets")) and "1 records" in message
    launch_job(services, **form(source=JSONL_SOURCE, task=None, data=stored))
    config = world["queue"].submitted[0][1]
    assert config["data"] == stored and "task" not in config


@pytest.mark.parametrize(
    "content, problem", [("not json\n", "not valid JSON"), ('{"input": 3}\n', "instruction")]
)
def test_an_unusable_upload_is_refused(services, tmp_path, content, problem):
    upload = tmp_path / "bad.jsonl"
    upload.write_text(content)
    _, stored, message = upload_dataset(services, str(upload))
    assert stored is None and message.startswith("**Upload refused:**") and problem in message
    assert str(tmp_path) not in message and inert("bad.jsonl") in message  # no temp path


def test_an_oversized_upload_is_refused_and_every_upload_is_removed(
    services, tmp_path, monkeypatch
):
    from ui.handlers import launch as launch_module

    line = json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n"
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    big.write_text(line * 100)
    small.write_text(line)
    monkeypatch.setattr(launch_module, "MAX_UPLOAD_BYTES", len(line) * 10)
    _, stored, message = upload_dataset(services, str(big))
    assert stored is None and "larger than" in message and not big.exists()
    _, stored, _ = upload_dataset(services, str(small))
    assert stored is not None and not small.exists()


def test_data_outside_the_roots_is_refused(services, world, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"instruction": "hi"}) + "\n")
    message = launch_job(services, **form(source=JSONL_SOURCE, data=str(outside)))
    assert "is not under a model root or the data directory" in message
    assert launch_job(services, **form(source=JSONL_SOURCE, data=None)).count("data:") == 1
    assert world["queue"].submitted == []


def test_held_out_accuracy_is_configured_for_built_in_tasks(services, world, tmp_path):
    launch_job(services, **form(heldout_every=2, heldout_prompts=16))
    config = world["queue"].submitted[-1][1]
    assert (config["heldout_every"], config["heldout_prompts"]) == (2, 16)
    refused = launch_job(services, **form(heldout_every=-1))
    assert inert("heldout_every must be a whole number >= 0") in refused
    data = services.data_dir / "held.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n")
    launch_job(services, **form(source=JSONL_SOURCE, data=str(data), heldout_every=10))
    assert "heldout_every" not in world["queue"].submitted[-1][1]  # needs a built-in task
