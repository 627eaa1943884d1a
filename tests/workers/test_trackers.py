"""``report_to``: each version's metrics, by TRL's names, read back from the TensorBoard event
files and the MLflow store the worker wrote; trackers checked at submission, never fatal."""

import logging
import sys

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from db import JobStatus, PolicyMetrics
from tests.workers.helpers import train_config
from workers.api import SpecError, validate_job
from workers.jobs import run_job
from workers.trackers import OPENERS, TrackedRun, Trackers, trl_metrics


def test_our_metrics_take_the_names_trl_logs_them_under():
    metrics = PolicyMetrics(
        reward_mean=0.5,
        reward_std=0.25,
        loss=-0.1,
        kl=0.01,
        train_infer_mismatch=0.003,
        num_accepted=1,
        num_rejected=2,
        extra={
            "response_length": 3.5,
            "clip_fraction": 0.125,
            "mismatch_mean": 0.001,
            "grad_norm": 0.75,
            "tis_weight_mean": 0.98,
            "heldout_accuracy": 0.4,
            "reward/math/mean": 0.75,
            "reward/math/std": 0.5,
        },
    )
    assert trl_metrics(metrics) == {
        "reward": 0.5,
        "reward_std": 0.25,
        "loss": -0.1,
        "kl": 0.01,
        "sampling/sampling_logp_difference/max": 0.003,
        "sampling/sampling_logp_difference/mean": 0.001,
        "sampling/importance_sampling_ratio/mean": 0.98,
        "completions/mean_length": 3.5,
        "clip_ratio/region_mean": 0.125,
        "grad_norm": 0.75,
        "num_accepted": 1.0,  # no TRL counterpart: our names
        "num_rejected": 2.0,
        "heldout_accuracy": 0.4,
        "rewards/math/mean": 0.75,  # a reward list's components, as TRL logs each function's
        "rewards/math/std": 0.5,
    }  # tokens_per_second was not recorded: left out


def test_report_to_is_checked_when_a_job_is_submitted(monkeypatch):
    job = {"model": "demo", "task": "always7"}
    assert validate_job("train", {**job, "report_to": ["tensorboard", "mlflow"]}) == 50
    with pytest.raises(SpecError, match=r"unknown tracker 'neptune' \(choose from tensorboard"):
        validate_job("train", {**job, "report_to": ["tensorboard", "neptune"]})
    with pytest.raises(SpecError, match="report_to must be a list of tracker names"):
        validate_job("train", {**job, "report_to": "tensorboard"})
    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable here
    with pytest.raises(
        SpecError, match=r"wandb not installed: pip install 'rl-workbench\[wandb\]'"
    ):
        validate_job("train", {**job, "report_to": ["wandb"]})


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def _history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


def test_every_version_is_logged_by_trl_names_and_a_resumed_job_appends(repo, settings, tiny_model):
    config = train_config(tiny_model, report_to=["tensorboard", "mlflow"], heldout_prompts=8)
    job = repo.create_job("train", config, total_steps=3)

    def cancel_at_step_2(meta):
        if meta["step"] == 2:
            repo.request_cancel(job.id)

    assert run_job(repo, job.id, settings, progress=cancel_at_step_2).status == "cancelled"
    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "succeeded"

    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == [0, 1, 2, 3]
    expected: dict[str, list[tuple[int, float]]] = {}
    for v in versions:
        for name, value in trl_metrics(v.metrics).items():
            expected.setdefault(name, []).append((v.version, value))
    by_db = {v.version: v.metrics for v in versions}
    assert expected["reward"] == [(v, by_db[v].reward_mean) for v in (1, 2, 3)]
    assert expected["loss"] == [(v, by_db[v].loss) for v in (1, 2, 3)]
    mismatch = "sampling/sampling_logp_difference/max"
    assert expected[mismatch] == [(v, by_db[v].train_infer_mismatch) for v in (1, 2, 3)]
    lengths = [(v, by_db[v].extra["response_length"]) for v in (1, 2, 3)]
    assert expected["completions/mean_length"] == lengths
    assert [step for step, _ in expected["heldout_accuracy"]] == [0, 3]

    runs = settings.jobs_dir / str(job.id) / "runs"
    scalars = _scalars(runs / "tensorboard")  # both attempts' event files
    assert set(scalars) == {f"train/{name}" for name in expected}
    for name, points in expected.items():
        logged = scalars[f"train/{name}"]  # float32 in the event file
        assert [step for step, _ in logged] == [step for step, _ in points]
        assert [value for _, value in logged] == pytest.approx([v for _, v in points], rel=1e-6)

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("rlwb").experiment_id])
    assert run.info.run_name == f"job-{job.id}" and run.info.status == "FINISHED"
    assert run.data.params["task"] == "always7" and run.data.params["steps"] == "3"
    assert set(run.data.metrics) == set(expected)
    for name, points in expected.items():
        assert _history(client, run.info.run_id, name) == points


def test_a_tracker_missing_on_the_worker_is_dropped_and_training_goes_on(
    repo, settings, tiny_model, monkeypatch, caplog
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # submitted elsewhere, not installed here
    config = train_config(tiny_model, steps=2, report_to=["wandb", "tensorboard"], heldout_every=0)
    job = repo.create_job("train", config, total_steps=2)

    with caplog.at_level(logging.WARNING, logger="workers.trackers"):
        assert run_job(repo, job.id, settings).status == "succeeded"

    assert repo.get_job(job.id).status is JobStatus.SUCCEEDED
    [warning] = [r.getMessage() for r in caplog.records if r.name == "workers.trackers"]
    assert warning.startswith("report_to wandb dropped, training goes on")
    scalars = _scalars(settings.jobs_dir / str(job.id) / "runs" / "tensorboard")
    assert [step for step, _ in scalars["train/reward"]] == [1, 2]


class FailsOnSecondLog:
    """A tracker whose disk fills up after its first version."""

    def __init__(self) -> None:
        self.logged: list[int] = []

    def log(self, metrics, step: int) -> None:
        if self.logged:
            raise OSError(28, "No space left on device")
        self.logged.append(step)

    def close(self) -> None:
        raise AssertionError("a dropped tracker is not used again")


def test_a_tracker_failing_while_logging_warns_once_and_is_dropped(tmp_path, monkeypatch, caplog):
    tracker = FailsOnSecondLog()
    monkeypatch.setitem(OPENERS, "trackio", lambda run: tracker)
    run = TrackedRun(tmp_path, "job-1", "rlwb-1", {}, tmp_path / "trackio")
    trackers = Trackers(("trackio",), run)

    with caplog.at_level(logging.WARNING, logger="workers.trackers"):
        for version in (1, 2, 3):
            trackers.log(PolicyMetrics(reward_mean=0.5), version)
        trackers.close()

    assert tracker.logged == [1]
    [warning] = caplog.records
    assert "report_to trackio dropped" in warning.getMessage()
    assert "No space left on device" in warning.getMessage()


def _entropy(checkpoint: str, prompt_text: str, response: list[int]) -> list[float]:
    """The entropy of each response token's distribution (T = 1), by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    logp = logits.float().log_softmax(-1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def test_learning_rate_entropy_and_the_share_of_zero_std_groups_by_trl_names(
    repo, settings, tiny_model
):
    """TRL logs ``learning_rate``, ``entropy`` and ``frac_reward_zero_std``; the trackers
    missed them (issue 32). Each is checked against what it means: the optimizer's rate, the
    trained tokens' mean entropy under the weights they were trained from (transformers), the
    share of the trained batch's groups whose rewards all agree (the stored rewards)."""
    from db import SampleFilter

    config = train_config(tiny_model, lr=0.002, reward="regex:.*[0-4].*", report_to=["tensorboard"])
    job = repo.create_job("train", config, total_steps=3)
    assert run_job(repo, job.id, settings).status == "succeeded"
    scalars = _scalars(settings.jobs_dir / str(job.id) / "runs" / "tensorboard")
    checkpoints = {v.version: v.checkpoint_path for v in repo.list_versions(job.id)}

    assert scalars["train/learning_rate"] == [(v, pytest.approx(0.002)) for v in (1, 2, 3)]
    shares, entropies = [], []
    for version in (1, 2, 3):  # trained on the batch sampled by the version before
        where = SampleFilter(job.id, min_version=version - 1, max_version=version - 1)
        samples = [repo.get_sample(s.id) for s in repo.list_samples(where).items]
        groups: dict[int, set[float]] = {}
        for sample in samples:
            groups.setdefault(sample.prompt_index, set()).add(sample.reward)
        shares.append((version, sum(len(r) == 1 for r in groups.values()) / len(groups)))
        tokens = [
            value
            for s in samples
            for value in _entropy(checkpoints[version - 1], s.prompt_text, s.response_token_ids)
        ]
        entropies.append((version, sum(tokens) / len(tokens)))
    assert scalars["train/frac_reward_zero_std"] == [(v, pytest.approx(f)) for v, f in shares]
    assert scalars["train/entropy"] == [(v, pytest.approx(e, rel=1e-4)) for v, e in entropies]


def test_a_studys_jobs_are_grouped_in_tensorboard_and_under_an_mlflow_parent_run(
    repo, settings, monkeypatch
):
    from workers import studies
    from workers.app import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)
    config = train_config("demo", task="addition", steps=1, max_tokens=6, heldout_every=0)
    config["report_to"] = ["tensorboard", "mlflow"]
    study = studies.run_study(config, {"name": "lrs", "grid": {"lr": [0.001, 0.003]}})
    jobs = repo.study_jobs(study.id)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 2

    folder = settings.data_dir / "studies" / "lrs"
    for job in jobs:  # one TensorBoard run per job in the study's folder, its own job's none
        scalars = _scalars(folder / "tensorboard" / f"job-{job.id}")
        assert [step for step, _ in scalars["train/reward"]] == [1]
        assert not (settings.jobs_dir / str(job.id) / "runs").exists()

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("rlwb").experiment_id])
    [parent] = [run for run in runs if run.info.run_name == "lrs"]
    children = {run.info.run_name: run for run in runs if run is not parent}
    assert set(children) == {f"job-{job.id}" for job in jobs}
    for job in jobs:
        child = children[f"job-{job.id}"]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["lr"] == str(job.config["lr"])
        assert _history(client, child.info.run_id, "reward") == [
            (1, repo.get_version(job.id, 1).metrics.reward_mean)
        ]
