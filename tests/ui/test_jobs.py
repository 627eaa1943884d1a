"""Jobs and Queue tab handlers: the job table, cancellation, a job's plots over versions,
the workers."""

import dataclasses

import pytest

from ui.handlers import jobs as jobs_module
from ui.handlers.jobs import (
    cancel_job,
    job_batches,
    job_page,
    jobs_table,
    resume_job,
)
from ui.handlers.queue import queue_view
from ui.plots import PLOTS, ema, has_data, plot_frame, shown
from ui.render import inert


def test_the_table_shows_status_progress_version_reward_and_speed(services, job, monkeypatch):
    monkeypatch.delenv("RLWB_DEVICE", raising=False)  # the worker's device: cpu
    row = jobs_table(services).set_index("job").loc[job.id]
    assert row["kind"] == "train" and row["status"] == "succeeded" and row["devices"] == "1 cpu"
    assert row["progress"] == "3/3 (100%)"
    assert row["version"] == 3
    assert row["reward"] == "0.75" and row["tokens/s"] == "103"


def test_a_job_page_plots_every_series_over_every_version(services, job):
    summary, config, frames, hidden = job_page(services, job.id)
    assert summary.startswith(f"### Job #{job.id} · train · succeeded")
    assert config["task"] == "always7"
    plots = {spec.key: frame for spec, frame in zip(PLOTS, frames, strict=True)}
    for spec, frame in zip(PLOTS, frames, strict=True):
        assert list(frame.columns) == ["version", "value", "series"]
        if spec.sparse:  # only the versions it was measured on: none here
            assert frame.empty
            continue
        assert sorted(set(frame["series"])) == sorted(spec.names())
        assert len(frame) == 4 * len(spec.names())  # versions 0..3, gaps kept as NaN
    reward = plots["reward"]
    raw = reward[reward["series"] == "reward mean (raw)"]["value"].tolist()
    assert raw == [0.0, 0.25, 0.5, 0.75]
    smoothed = reward[reward["series"] == "reward mean (EMA)"]["value"].tolist()
    assert smoothed == pytest.approx([0.0, 0.05, 0.14, 0.262])  # 0.8 previous + 0.2 new
    rejected = plots["batches"][plots["batches"]["series"] == "rejected"]
    assert rejected["value"].tolist() == [0, 1, 0, 0]
    assert not has_data(plots["heldout"])  # no held-out accuracy recorded: "no data yet"
    assert hidden == {"kl"}  # the job has no KL coefficient: KL could only be flat


def test_the_version_still_generating_is_not_drawn_as_zero_accepted(services, job):
    metrics = services.repository.version_metrics(job.id)
    generating = dataclasses.replace(
        metrics[-1], version=4, recorded=None, num_accepted_batches=0, num_rejected_batches=0
    )
    frames = jobs_module.version_frames([*metrics, generating])
    batches = frames[[spec.key for spec in PLOTS].index("batches")]
    newest = batches[batches["version"] == 4]
    assert newest["value"].isna().all() and len(newest) == 2
    assert batches[batches["version"] == 3]["value"].tolist() == [1, 0]


def test_the_mismatch_axis_tells_millionths_apart():
    import gradio as gr

    from ui.tabs.jobs import _plot

    spec = next(spec for spec in PLOTS if spec.key == "mismatch")
    with gr.Blocks():
        plot, _ = _plot(spec)
    ticks = [format(value, plot.y_axis_format) for value in (2e-6, 4e-6, 6e-6, 8e-6)]
    assert [float(tick) for tick in ticks] == [2e-6, 4e-6, 6e-6, 8e-6]


def test_a_single_reward_job_shows_no_reward_components_plot_nor_note(services, job):
    _, _, frames, hidden = job_page(services, job.id)
    index = [spec.key for spec in PLOTS].index("reward-components")
    assert shown(PLOTS[index], frames[index], hidden) == (False, False)


def test_a_sparse_plot_joins_its_known_points():
    spec = next(spec for spec in PLOTS if spec.key == "heldout")
    values = {0: {"held-out accuracy": 0.2}, 1: {}, 2: {"held-out accuracy": 0.5}}
    frame = plot_frame(spec, values)
    assert frame["version"].tolist() == [0, 2] and frame["value"].tolist() == [0.2, 0.5]
    assert set(frame["series"]) == {"held-out accuracy"}  # no mean@k: no empty series


def test_the_heldout_plot_draws_mean_at_k_beside_pass_at_1(services):
    """A version's ``heldout_mean_at_k`` (sampled, when the job sets heldout_k) is the held-out
    plot's second series."""
    from db import PolicyMetrics, PolicyVersionRecord

    repo = services.repository
    job = repo.create_job("train", {"model": "m", "task": "addition"}, total_steps=2)
    job = repo.start_attempt(job.id, None)
    job = repo.mark_running(job.id, fence=job.fence)
    for version, (greedy, sampled) in enumerate([(0.25, 0.125), (0.5, 0.375)]):
        extra = {"heldout_accuracy": greedy, "heldout_mean_at_k": sampled}
        record = PolicyVersionRecord(job.id, version, None, None, None, PolicyMetrics(extra=extra))
        repo.record_policy_version(record, fence=job.fence)
    frame = job_page(services, job.id)[2][[spec.key for spec in PLOTS].index("heldout")]
    by_series = {name: group["value"].tolist() for name, group in frame.groupby("series")}
    assert by_series == {"held-out accuracy": [0.25, 0.5], "held-out mean@k": [0.125, 0.375]}


def test_ema_skips_unknown_values():
    assert ema([None, 1.0, None, 2.0], weight=0.5) == [None, 1.0, None, 1.5]
    assert ema([float("nan"), 4.0]) == [None, 4.0]


def test_a_missing_or_unreadable_job_is_said_so(services):
    assert job_page(services, None)[0] == "Choose a job."
    assert job_page(services, 999)[0] == "**job 999 does not exist**"
    assert "is not a number" in job_page(services, "abc")[0]
    assert not any(has_data(frame) for frame in job_page(services, 999)[2])


def test_batches_list_rejections_with_their_reasons(services, job):
    table = job_batches(services, job.id)
    assert table["status"].tolist().count("rejected") == 1
    rejected = table[table["status"] == "rejected"].iloc[0]
    assert rejected["reasons"] == "sample 1: error/kv_exhausted: no free KV pages"
    assert job_batches(services, None).empty and job_batches(services, 999).empty


def test_batches_show_the_latest_in_recorded_order(services, world, job, monkeypatch):
    monkeypatch.setattr(jobs_module, "BATCHES_SHOWN", 2)
    every = world["repo"].list_batches(job.id)
    assert len(every) == 5
    table = job_batches(services, job.id)
    assert table["batch"].tolist() == [b.id for b in every[-2:]]
    assert table["step"].tolist() == [2, 3]


def test_cancel_a_queued_job(services, world):
    queued = world["repo"].create_job("train", {"model": "demo", "task": "always7"})
    assert cancel_job(services, queued.id) == f"Job **#{queued.id}** is cancelled."
    assert world["repo"].get_job(queued.id).cancel_requested
    assert cancel_job(services, None) == "Choose a job to cancel."
    assert cancel_job(services, 999) == "**Cannot cancel:** job 999 does not exist"
    world["repo"].delete_job(queued.id)


def test_resume_a_cancelled_train_job_and_refuse_others(services, world):
    repo = world["repo"]
    job = repo.create_job("train", {"model": "demo", "task": "always7"})
    repo.request_cancel(job.id)
    assert resume_job(services, job.id) == f"Job **#{job.id}** is queued."
    resumed = repo.get_job(job.id)
    assert not resumed.cancel_requested and resumed.attempts == 0 and resumed.error is None
    assert resume_job(services, job.id).startswith("**Cannot resume:** job")  # queued
    assert resume_job(services, None) == "Choose a job to resume."
    repo.request_cancel(job.id)
    repo.delete_job(job.id)


def test_a_stalled_job_shows_why_in_the_table_and_page_and_can_resume(services, world):
    repo = world["repo"]
    job = repo.create_job("train", {"model": "demo", "task": "always7"})
    repo.mark_running(job.id)
    reason = "every sample scored 0.0 in 6 batches: check the reward and the task"
    repo.mark_stalled(job.id, reason)
    assert jobs_table(services).set_index("job").loc[job.id]["status"] == "stalled"
    summary = job_page(services, job.id)[0]
    assert summary.startswith(f"### Job #{job.id} · train · stalled")
    assert f"**Stalled:** {inert(reason)}" in summary
    assert resume_job(services, job.id) == f"Job **#{job.id}** is queued."
    repo.delete_job(job.id)


def test_the_queue_shows_workers_tasks_and_commands(services, monkeypatch):
    monkeypatch.delenv("RLWB_DEVICE", raising=False)  # the worker's device: cpu
    summary, workers, active, reserved, commands = queue_view(services)
    assert summary.startswith("**1** worker(s) online · **1** active · **0** reserved")
    assert workers["worker"].tolist() == ["gpu0@test"]
    assert active.iloc[0].to_dict() == {
        "worker": "gpu0@test",
        "task_id": "t-1",
        "name": "workers.train",
        "args": "[1]",
        "devices": "1 cpu",
    }
    assert reserved.empty
    assert "celery -A workers.app inspect ping" in commands


def test_an_unreachable_queue_keeps_the_page_up(services):
    def down():
        raise ConnectionError("broker down")

    broken = dataclasses.replace(services, queue_overview=down)
    summary, workers, active, _, commands = queue_view(broken)
    assert summary == "**Queue unreachable:** ConnectionError: broker down"
    assert workers.empty and active.empty and commands == ""


def test_eta_from_the_pace_of_the_versions(world):
    from datetime import timedelta

    from db import PolicyMetrics, PolicyVersionInfo
    from ui.progress import duration, eta_seconds

    job = world["repo"].create_job("train", {"model": "demo", "task": "addition"}, total_steps=10)
    start = job.created_at
    versions = [
        PolicyVersionInfo(
            job.id, v, None, None, None, PolicyMetrics(), start + timedelta(seconds=3 * v)
        )
        for v in range(5)
    ]
    job = dataclasses.replace(job, step=4)
    assert eta_seconds(versions, job) == 18.0  # 6 steps left at 3 s each
    assert eta_seconds(versions[:1], job) is None
    assert (duration(18), duration(185), duration(3725)) == ("18s", "3m 05s", "1h 02m")
    world["repo"].delete_job(job.id)


def test_a_running_jobs_phase_shows_in_the_table(services, world):
    repo = world["repo"]
    job = repo.create_job("train", {"model": "demo", "task": "addition"}, total_steps=300)
    repo.mark_running(job.id)
    repo.update_progress(job.id, 0, phase="building the demo policy: warm-up step 40")
    row = jobs_table(services).set_index("job").loc[job.id]
    assert row["progress"] == "0/300 (0%) · building the demo policy: warm-up step 40"
    repo.update_progress(job.id, 0)  # the steps began: the phase is over
    assert repo.get_job(job.id).phase is None
    repo.mark_failed(job.id, "done with it")
    repo.delete_job(job.id)


def test_the_queue_tab_shows_the_database_side_without_asking_the_workers(services, world):
    from ui.handlers.queue import queue_first_view

    asked = []
    quick = dataclasses.replace(services, queue_overview=lambda: asked.append(1) or {})
    summary, commands = queue_first_view(quick)
    assert summary.startswith("Asking the workers…") and "0 queued" in summary
    assert "inspect active" in commands and asked == []
