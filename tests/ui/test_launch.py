"""Launch tab handlers: the form becomes a validated train config, or problems shown inline."""

import dataclasses
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from core_engine.rl.data.files import record_count
from tests.core_engine.test_user_files import HANG_GUARD_S, fifo, sparse, within
from ui.handlers.launch import (
    JSONL_SOURCE,
    MAX_UPLOAD_BYTES,
    TASK_DEFAULT_REWARD,
    TASK_SOURCE,
    dataset_choices,
    launch_job,
    upload_dataset,
)
from ui.handlers.model_form import SHIPPED_CHOICES, model_choices
from ui.render import inert
from workers import api
from workers.shipped import CALCULATOR_MODEL, DEMO_MODEL, R1_MODEL


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
        ("built-in calculator policy: word problems with a tool", CALCULATOR_MODEL),
        ("R1 recipe (math + format): word problems in <think>/<answer>", R1_MODEL),
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
        "pipeline": "sync",
        "devices": 1,
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
    assert inert("top_p must be <= 1") in message
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
    "content, problem", [("not json\n", "not valid JSON"), ('{"input": 3}\n', "nor 'instruction'")]
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
    assert stored is None and "over the 500 bytes limit" in message and not big.exists()
    _, stored, _ = upload_dataset(services, str(small))
    assert stored is not None and not small.exists()


def test_data_outside_the_roots_is_refused(services, world, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"instruction": "hi"}) + "\n")
    message = launch_job(services, **form(source=JSONL_SOURCE, data=str(outside)))
    assert "is not under a model root or the data directory" in message
    assert launch_job(services, **form(source=JSONL_SOURCE, data=None)).count(inert("data:")) == 1
    assert world["queue"].submitted == []


def test_held_out_accuracy_is_configured_for_built_in_tasks(services, world, tmp_path):
    launch_job(services, **form(heldout_every=2, heldout_prompts=16))
    config = world["queue"].submitted[-1][1]
    assert (config["heldout_every"], config["heldout_prompts"]) == (2, 16)
    refused = launch_job(services, **form(heldout_every=-1))
    assert inert("heldout_every must be >= 0") in refused
    data = services.data_dir / "held.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n")
    launch_job(services, **form(source=JSONL_SOURCE, data=str(data), heldout_every=10))
    assert "heldout_every" not in world["queue"].submitted[-1][1]  # no held-out fraction


def _csv_upload(services, tmp_path, header: str = "question,answer") -> str:
    upload = tmp_path / "math.csv"
    rows = "\n".join(f'"What is {n}+1?",{n + 1}' for n in range(10))
    upload.write_text(f"{header}\n{rows}\n")
    _, stored, message = upload_dataset(services, str(upload))
    assert stored is not None and stored.endswith(".csv"), message
    assert "Stored 10 records" in message and stored in dataset_choices(services)
    return stored


def test_a_csv_upload_is_counted_and_launched_with_its_mapping_and_held_out(
    services, world, tmp_path
):
    stored = _csv_upload(services, tmp_path)
    settings = {"prompt_column": " question ", "answer_column": "answer"}
    settings |= {"system_prompt": "Think, then answer.", "heldout_fraction": 0.2}
    settings |= {"heldout_k": 4, "heldout_every": 5, "heldout_prompts": 2}
    message = launch_job(services, **form(source=JSONL_SOURCE, task=None, data=stored, **settings))
    assert message.startswith("Job **#"), message
    config = world["queue"].submitted[-1][1]
    assert {k: config[k] for k in settings} == {**settings, "prompt_column": "question"}
    launch_job(services, **form(source=JSONL_SOURCE, task=None, data=stored, heldout_k=0))
    config = world["queue"].submitted[-1][1]  # blank and 0: automatic columns, no held-out
    assert not {"prompt_column", "system_prompt", "heldout_fraction", "heldout_k"} & set(config)
    refused = launch_job(
        services, **form(source=JSONL_SOURCE, task=None, data=stored, heldout_fraction=0.9)
    )
    assert "Nothing was enqueued" in refused and inert("heldout_fraction must be <= 0.5") in refused


def test_a_missing_column_is_refused_inline_naming_file_and_column(services, world, tmp_path):
    stored = _csv_upload(services, tmp_path)
    count = len(world["queue"].submitted)
    refused = launch_job(
        services, **form(source=JSONL_SOURCE, task=None, data=stored, prompt_column="problem_text")
    )
    assert (
        refused.startswith("**Nothing was enqueued.**") and len(world["queue"].submitted) == count
    )
    assert inert(Path(stored).name) in refused and inert("'problem_text'") in refused
    upload = tmp_path / "other.csv"
    upload.write_text("q,a\nhi,1\n")
    _, stored, message = upload_dataset(services, str(upload))
    assert stored is None and "Upload refused" in message and "question" in message
    upload.write_text("q,a\nhi,1\n")  # every upload is removed, refused or kept
    _, stored, message = upload_dataset(services, str(upload), "q", "a")
    assert stored is not None and "Stored 1 records" in message


def test_clone_fills_back_the_data_file_settings(services, world, tmp_path):
    from ui.handlers.clone import clone_form
    from ui.handlers.launch import train_config

    stored = _csv_upload(services, tmp_path)
    settings = {"prompt_column": "question", "answer_column": "answer", "system_prompt": "Hi."}
    settings |= {"heldout_fraction": 0.25, "heldout_k": 3, "heldout_every": 4}
    launch_job(services, **form(source=JSONL_SOURCE, task=None, data=stored, **settings))
    config = world["queue"].submitted[-1][1]
    job = services.repository.create_job("train", config)
    values, _ = clone_form(services, job.id)
    assert values["source"] == JSONL_SOURCE and values["data"] == stored
    assert {k: values[k] for k in settings} == settings
    shown = train_config(services, **values)  # with the default prompt count, as the form shows
    assert shown == {**config, "heldout_prompts": api.HELDOUT_PROMPTS}
    plain = services.repository.create_job("train", {**form(), "reward": None})
    values, _ = clone_form(services, plain.id)
    assert (values["prompt_column"], values["heldout_fraction"], values["heldout_k"]) == ("", 0, 0)


def test_trackers_are_chosen_on_the_form_and_must_be_installed(services, world, monkeypatch):
    launch_job(services, **form(report_to=["tensorboard", "mlflow"]))
    assert world["queue"].submitted[-1][1]["report_to"] == ["tensorboard", "mlflow"]
    launch_job(services, **form(report_to=[]))
    assert "report_to" not in world["queue"].submitted[-1][1]
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed here
    refused = launch_job(services, **form(report_to=["wandb"]))
    assert inert("report_to: wandb not installed: pip install 'rl-workbench[wandb]'") in refused


def test_the_form_says_how_records_and_regex_rewards_are_read(services):
    """The help beside the data and reward fields states what the trainer then does."""
    from core_engine.rl.data import instruction_to_messages
    from core_engine.rl.rewards import resolve_reward
    from ui.app import build_app

    demo = build_app(services)
    info = {b.elem_id: getattr(b, "info", None) for b in demo.blocks.values() if b.elem_id}
    assert "instruction -> system and input -> user" in info["launch-data"]
    assert instruction_to_messages("S", "U")[0] == {"role": "system", "content": "S"}
    assert "instruction without input -> user" in info["launch-data"]
    assert instruction_to_messages("Q", "") == [{"role": "user", "content": "Q"}]
    assert "matches the whole response, stripped" in info["launch-reward"]
    assert resolve_reward("regex:7")([" 7\n", "17"], ["", ""], ["", ""]) == [1.0, 0.0]


def isolated(services, tmp_path: Path):
    """The services with a model root and a data directory of this test's own."""
    return dataclasses.replace(
        services, model_roots=(tmp_path / "models",), data_dir=tmp_path / "data"
    )


# Issue 24, item 3: the form's numbers have the job's types and ranges, and its sizes meet the
# footprint rule, before anything is queued.
def test_the_form_refuses_huge_and_non_finite_numbers_and_too_many_samples(
    services, world, monkeypatch
):
    for change, problem in (
        ({"steps": "1e300"}, "steps must be <= 1,000,000,000"),
        ({"steps": float("nan")}, "steps: nan is not finite"),
        ({"lr": "inf"}, "lr: 'inf' is not finite"),
        ({"batch_size": 2.5}, "batch_size: a whole number is required"),
    ):
        assert inert(problem) in launch_job(services, **form(**change))
    monkeypatch.setenv("RLWB_HOST_MEMORY", str(16 * 2**30))
    refused = launch_job(services, **form(batch_size=65_536, group_size=64, max_tokens=1))
    assert inert("footprint: one step's rollouts need at least 20.9 GiB") in refused
    assert world["queue"].submitted == []


# Issue 24, item 7: a FIFO or a huge sparse file under a model root or the data directory is
# neither offered nor read: Launch refuses it at once, at no memory cost.
def test_special_files_under_the_roots_are_not_offered_and_refused_at_once(services, tmp_path):
    mine = isolated(services, tmp_path)
    for name, make in (("pipe", fifo), ("sparse", sparse)):
        folder = tmp_path / "models" / name
        make(folder / "config.json")
        (folder / "model.safetensors").write_bytes(b"")
    fifo(tmp_path / "data" / "pipe.jsonl")
    sparse(tmp_path / "data" / "huge.jsonl")
    # scanning the roots opens none of them (an opened FIFO would block for ever)
    assert within(HANG_GUARD_S, lambda: model_choices(mine)) == SHIPPED_CHOICES
    assert within(HANG_GUARD_S, lambda: dataset_choices(mine)) == []
    for change, problem in (
        ({"model": str(tmp_path / "models" / "pipe")}, "config.json is a FIFO"),
        ({"model": str(tmp_path / "models" / "sparse")}, "over the 64.0 MiB limit"),
        ({"source": JSONL_SOURCE, "data": str(tmp_path / "data" / "pipe.jsonl")}, "a FIFO"),
        ({"source": JSONL_SOURCE, "data": str(tmp_path / "data" / "huge.jsonl")}, "4,096.0"),
    ):
        tracemalloc.start()
        message = within(HANG_GUARD_S, lambda c=change: launch_job(mine, **form(**c)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert inert(problem) in message and "Nothing was enqueued" in message
        assert peak < 16 * 2**20  # was 2 GiB per click for the sparse file


# Issue 24, item 8: an upload is parsed once, when it arrives; Launch then costs a stat.
def test_a_64_mib_upload_of_tiny_records_is_parsed_once(services, world, tmp_path, monkeypatch):
    from workers import api

    parses = []

    def counting(path, columns):
        parses.append(path)
        return record_count(path, columns)

    monkeypatch.setattr(api, "record_count", counting)
    mine = isolated(services, tmp_path)
    line = json.dumps({"instruction": "What is 7? " + "x" * 60}) + "\n"  # 0.9M records
    upload = tmp_path / "tiny.jsonl"
    upload.write_text(line * (MAX_UPLOAD_BYTES // len(line)))
    assert upload.stat().st_size > 63 * 2**20
    _, stored, message = upload_dataset(mine, str(upload))
    assert stored is not None and f"{MAX_UPLOAD_BYTES // len(line)} records" in message
    for _ in range(2):
        launched = launch_job(mine, **form(source=JSONL_SOURCE, task=None, data=stored))
        assert "is queued" in launched
    assert len(parses) == 1  # at upload only, not per Launch click (each took ~23 s)


def test_the_stored_uploads_have_a_quota(services, tmp_path, monkeypatch):
    from ui import files

    mine = isolated(services, tmp_path)
    record = json.dumps({"instruction": "", "input": "3?", "output": "7"}) + "\n"
    monkeypatch.setattr(files, "UPLOAD_QUOTA_BYTES", 3 * len(record))
    stored = []
    for number in range(4):
        upload = tmp_path / f"set{number}.jsonl"
        upload.write_text(record)
        _, path, message = upload_dataset(mine, str(upload))
        stored.append(path)
        assert not upload.exists()
    assert None not in stored[:3] and stored[3] is None
    quota = "would take 200 bytes, over their 150 bytes quota (RLWB_UPLOAD_QUOTA_MB)"
    assert inert(quota) in message
    assert str(tmp_path) not in message
    assert files.stored_bytes(mine.data_dir / files.UPLOADS_DIR) == 3 * len(record)
    Path(stored[0]).unlink()  # room again
    upload = tmp_path / "again.jsonl"
    upload.write_text(record)
    assert upload_dataset(mine, str(upload))[1] is not None
