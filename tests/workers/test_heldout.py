"""Held-out scores during training: stored with the due versions, equal to a fresh engine's
greedy score (with the job's reward) of the version's checkpoint on the same held-out prompts,
none of them a training prompt, for a built-in task and a data file alike; bad settings are
refused before the job is queued."""

import pandas as pd
import pytest

from core_engine.engine import load_engine
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.files import Columns
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.rewards.mix import RewardMix
from core_engine.rl.trainer.evaluate import evaluate
from core_engine.task import SamplingParams
from tests.workers.helpers import train_config
from workers.evaluation import HeldoutEval, heldout_eval
from workers.jobs import run_job
from workers.specs import HeldoutSettings, SpecError, heldout_settings, validate
from workers.specs import train_config as trainer_config
from workers.submission import validate_job


def test_heldout_accuracy_is_stored_every_n_versions(repo, settings, tmp_path):
    from core_engine.toy import save_tiny_checkpoint

    # the always7 alphabet: the tiny model learns to answer 7 in a few steps
    model = str(save_tiny_checkpoint(tmp_path / "tiny", alphabet="0123456789?=+"))
    config = train_config(
        model,
        steps=3,
        batch_size=4,
        group_size=8,
        max_tokens=2,
        lr=0.003,
        heldout_every=2,
        heldout_prompts=12,
        reward="regex:^7",  # the job's reward scores the held-out answers too
    )
    job = repo.create_job("train", config, total_steps=3)
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert repo.get_job(job.id).phase is None
    versions = repo.list_versions(job.id)
    scored = {v.version: v.metrics.extra.get("heldout_accuracy") for v in versions}
    assert [v for v, acc in scored.items() if acc is not None] == [0, 2, 3]  # due + last

    records = prompt_records("always7", None, seed=0)
    trainer = trainer_config(config, str(tmp_path / "unused"))
    heldout = heldout_eval(trainer, HeldoutSettings(2, 12), Columns(), records)[1]
    assert heldout.reward == "regex:^7"
    assert len(heldout.records) == 12
    accuracies = set()
    for v in versions:
        if scored[v.version] is not None:
            engine = load_engine(v.checkpoint_path, policy_version=v.version)
            assert heldout.accuracy(engine) == pytest.approx(scored[v.version])
            accuracies.add(scored[v.version])
    assert len(accuracies) > 1  # it moved: a score of the weights, not a constant


def test_a_reward_list_scores_heldout_with_the_weighted_total_and_each_component(
    repo, settings, tmp_path
):
    from core_engine.toy import save_tiny_checkpoint

    model = str(save_tiny_checkpoint(tmp_path / "tiny", alphabet="0123456789?=+"))
    rewards = [
        {"name": "regex:^7", "weight": 1.0},
        {"name": "length", "weight": 0.5, "threshold": 1},  # token counts: 0 at 1, -1 at 3
    ]
    config = train_config(model, steps=3, batch_size=4, group_size=4, max_tokens=3, lr=0.003)
    config |= {"heldout_every": 2, "heldout_prompts": 12, "reward": rewards}
    validate_job("train", config)  # a list with held-out evaluation on is accepted
    job = repo.create_job("train", config, total_steps=3)
    assert run_job(repo, job.id, settings).status == "succeeded"
    versions = [v for v in repo.list_versions(job.id) if "heldout_accuracy" in v.metrics.extra]
    assert [v.version for v in versions] == [0, 2, 3]

    trainer = trainer_config(config, str(tmp_path / "unused"))
    records = prompt_records("always7", None, seed=0)
    heldout = heldout_eval(trainer, HeldoutSettings(2, 12), Columns(), records)[1].records
    mix = RewardMix(rewards, 3)  # the trainer's weighted sum
    for v in versions:
        engine = load_engine(v.checkpoint_path, policy_version=v.version)
        fresh = evaluate(engine, heldout, mix, SamplingParams(temperature=0, max_tokens=3))
        extra = v.metrics.extra
        assert extra["heldout_accuracy"] == pytest.approx(fresh.mean_reward)  # mean total
        for name, values in fresh.components.items():
            assert extra[f"heldout/{name}"] == pytest.approx(sum(values) / len(values))
        lengths = [len(ids) for ids in fresh.rollout.response_ids]
        expected = [
            float(c.strip() == "7") + 0.5 * max(-1.0, min(0.0, (1 - n) / 2))
            for c, n in zip(fresh.rollout.completions, lengths, strict=True)
        ]
        assert fresh.rewards == pytest.approx(expected)
        assert set(fresh.components) == {"regex:^7", "length"}


def test_heldout_prompts_are_never_training_prompts_when_the_task_has_enough():
    records = prompt_records("addition", None, seed=0)
    config = GRPOConfig(model="m", output_dir="o", task="addition", max_tokens=6)
    heldout = heldout_eval(config, HeldoutSettings(10, 200), Columns(), records)[1]
    assert len(heldout.records) == 200
    assert not {r["input"] for r in heldout.records} & {r["input"] for r in records}


def test_heldout_settings_are_checked_before_queueing(tiny_model):
    assert heldout_settings({"task": "addition"}).every == 10
    assert heldout_settings({"data": "x.jsonl"}).every == 0
    for bad, message in (
        ({"heldout_every": -1}, "heldout_every must be >= 0"),
        ({"heldout_prompts": 0}, "heldout_prompts must be >= 1"),
        ({"heldout_prompts": 2001}, "heldout_prompts must be <= 2,000"),
        ({"heldout_every": 2.5}, "heldout_every must be a whole number"),
    ):
        with pytest.raises(SpecError, match=message):
            validate("train", train_config(tiny_model, **bad))
    with pytest.raises(SpecError, match="needs held-out prompts"):
        heldout_settings({"data": "x.jsonl", "heldout_every": 5})
    assert heldout_settings({"data": "x.jsonl", "heldout_fraction": 0.2}).every == 10
    for bad, message in (
        ({"data": "x", "heldout_fraction": 0.6}, "heldout_fraction must be <= 0.5"),
        ({"data": "x", "heldout_fraction": 0}, "heldout_fraction must be > 0"),
        ({"task": "addition", "heldout_fraction": 0.1}, "heldout_fraction needs 'data'"),
        ({"data": "x", "heldout_fraction": 0.1, "heldout_data": "y"}, "give one of"),
        ({"task": "addition", "heldout_k": 65}, "heldout_k must be <= 64"),
    ):
        with pytest.raises(SpecError, match=message):
            heldout_settings(bad)


def _rows(count: int, offset: int = 0) -> list[dict[str, str]]:
    return [{"question": f"{i}?", "answer": "so 7\n#### 7"} for i in range(offset, count)]


def test_heldout_fraction_is_disjoint_from_training(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = _rows(40) + _rows(10)  # repeated prompts stay on one side
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    config = GRPOConfig(model="m", output_dir="o", data=str(path), seed=3)
    records = prompt_records(None, str(path))
    settings = heldout_settings({"data": str(path), "heldout_fraction": 0.25})
    train, heldout = heldout_eval(config, settings, Columns(), records)
    train_prompts = {r["input"] for r in train}
    held_prompts = {r["input"] for r in heldout.records}
    assert len(held_prompts) == 10 and not train_prompts & held_prompts
    assert train_prompts | held_prompts == {f"{i}?" for i in range(40)}
    assert len(train) + len(heldout.records) == len(records)
    again = heldout_eval(config, settings, Columns(), records)[1]
    assert again.records == heldout.records  # seeded


@pytest.mark.parametrize("held", ["fraction", "file"])
def test_data_job_heldout_is_scored_with_the_jobs_reward(repo, settings, tmp_path, held):
    from core_engine.toy import save_tiny_checkpoint

    model = str(save_tiny_checkpoint(tmp_path / "tiny", alphabet="0123456789?=+"))
    data, test = tmp_path / "train.csv", tmp_path / "test.parquet"
    pd.DataFrame(_rows(24)).to_csv(data, index=False)
    pd.DataFrame(_rows(40, 30)).to_parquet(test)
    extra = {"heldout_fraction": 0.25} if held == "fraction" else {"heldout_data": str(test)}
    config = train_config(model, task=None, data=str(data), steps=2, max_tokens=2)
    config |= {**extra, "heldout_every": 1, "heldout_k": 2, "reward": "regex:7"}
    job = repo.create_job("train", config, total_steps=2)
    assert run_job(repo, job.id, settings).status == "succeeded"
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == [0, 1, 2]
    records = prompt_records(None, str(test if held == "file" else data))
    if held == "fraction":
        trainer = trainer_config(config, str(tmp_path / "unused"))
        records = heldout_eval(trainer, heldout_settings(config), Columns(), records)[1].records
    assert {r["output"] for r in records} == {"7"}  # GSM8K's answer after '####'
    params = SamplingParams(temperature=1.0, max_tokens=2)
    heldout = HeldoutEval(records, "regex:7", HeldoutSettings(1, 200, k=2), params)
    for v in versions:
        engine = load_engine(v.checkpoint_path, policy_version=v.version)
        scores = heldout.scores(engine)
        assert v.metrics.extra["heldout_accuracy"] == pytest.approx(scores["heldout_accuracy"])
        assert v.metrics.extra["heldout_mean_at_k"] == pytest.approx(scores["heldout_mean_at_k"])
