"""The Runs view through its handlers, over a sweep stored in a real database: its numbers
against what the database holds per job (read back here by other calls), its statistics
against computations written here, its grouping, refusals and exports."""

import csv
import math
import time
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client

from db import InvalidValue, SampleFilter
from db.repository.studies import StudyJobRecord
from tests.ui.conftest import new_repository
from tests.ui.helpers import FakeQueue
from tests.ui.runs_data import seed_run, seed_sweep
from tests.ui.test_run_stats import _reference_ci, _tensorboard_ema
from ui import app as ui_app
from ui.handlers.runs import (
    export_runs,
    metric_choices,
    runs_for_selection,
    runs_view,
    study_choices,
    study_runs,
)
from ui.run_stats import SCORE_RESAMPLES
from ui.tabs import runs as runs_tab

LRS = (0.001, 0.01)
SEEDS = 3
VERSIONS = 7


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """2 learning rates x 3 seeds, plus one run of a third learning rate (one seed)."""
    import random

    root = tmp_path_factory.mktemp("runs")
    repo = new_repository(root)
    jobs = seed_sweep(repo, root, LRS, SEEDS, VERSIONS)
    jobs.append(seed_run(repo, root, 0.1, 0, VERSIONS, random.Random(5)))
    services = FakeQueue(repo).services((root,), root / "data")
    yield {"repo": repo, "jobs": jobs, "services": services, "ids": [j.id for j in jobs]}
    repo.close()


def _final_heldout(repo, job_id):
    """The job's held-out accuracy at its highest version that has one, read from its
    versions."""
    versions = repo.list_versions(job_id)
    scored = [v for v in versions if "heldout_accuracy" in v.metrics.extra]
    return scored[-1].metrics.extra["heldout_accuracy"], scored[-1].version


def _cell(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def test_the_tables_equal_the_held_out_scores_in_the_database(sweep):
    repo, ids = sweep["repo"], sweep["ids"]
    _, points, runs, _, _ = runs_view(sweep["services"], ids, "reward_mean", "version", 0)
    finals = {job: _final_heldout(repo, job) for job in ids}
    for row in runs.itertuples(index=False):
        assert (row[3], row[4]) == finals[row[0]]
    by_lr = {}
    for job in sweep["jobs"]:
        by_lr.setdefault(job.config["lr"], []).append(finals[job.id][0])
    assert list(points["point"]) == [f"lr={lr}" for lr in by_lr]
    for row, scores in zip(points.itertuples(index=False), by_lr.values(), strict=True):
        assert row[1] == len(scores)
        assert row[2] == pytest.approx(np.mean(scores))
        if len(scores) == 1:
            assert _cell(row[3]) is None and _cell(row[4]) is None
        else:
            expected = _reference_ci(scores, SCORE_RESAMPLES, seed=0)
            assert (row[3], row[4]) == pytest.approx(expected, abs=1e-12)


def test_speed_and_cost_from_the_database(sweep):
    repo, ids = sweep["repo"], sweep["ids"]
    _, points, runs, _, _ = runs_view(sweep["services"], ids, "reward_mean", "version", 0)
    for row in runs.itertuples(index=False):
        job = repo.get_job(row[0])
        samples = repo.list_samples(SampleFilter(job.id), limit=1000).items
        assert row[8] == sum(s.response_length for s in samples)
        assert row[7] == pytest.approx((job.finished_at - job.started_at).total_seconds())
        versions = repo.list_versions(job.id)
        span = (versions[-1].created_at - versions[0].created_at).total_seconds()
        assert row[5] == pytest.approx((VERSIONS - 1) / (span / 60), rel=1e-3)  # SQLite: ms
    first = runs[runs["point"] == f"lr={LRS[0]}"]
    assert points.iloc[0]["tokens"] == first["tokens"].sum()
    assert points.iloc[0]["device·s"] == pytest.approx(first["device·s"].sum())


def test_a_curve_is_the_mean_over_seeds_of_each_runs_smoothed_values(sweep, tmp_path):
    repo, ids = sweep["repo"], sweep["ids"]
    files, _ = export_runs(sweep["services"], ids, "reward_mean", "version", 0.6)
    with open(files[0], newline="") as file:
        rows = list(csv.DictReader(file))
    smoothed = {
        job.id: _tensorboard_ema([v.metrics.reward_mean for v in repo.list_versions(job.id)], 0.6)
        for job in sweep["jobs"]
    }
    for row in rows:
        if row["series"] == "run":
            expected = smoothed[int(row["job"])][int(row["version"])]
            assert float(row["value"]) == pytest.approx(expected)
    point = f"lr={LRS[1]}"
    members = [job.id for job in sweep["jobs"] if job.config["lr"] == LRS[1]]
    means = [r for r in rows if r["series"] == "mean" and r["point"] == point]
    assert len(means) == VERSIONS
    for row in means:
        version = int(row["version"])
        assert float(row["value"]) == pytest.approx(
            np.mean([smoothed[j][version] for j in members])
        )
        assert float(row["ci_low"]) <= float(row["value"]) <= float(row["ci_high"])


def test_tokens_and_wall_time_axes_read_the_database(sweep):
    repo = sweep["repo"]
    job = sweep["jobs"][0]
    files, _ = export_runs(sweep["services"], [job.id], "reward_mean", "tokens", 0)
    with open(files[0], newline="") as file:
        xs = [float(r["x"]) for r in csv.DictReader(file) if r["series"] == "run"]
    samples = repo.list_samples(SampleFilter(job.id), limit=1000).items
    per_version = [
        sum(s.response_length for s in samples if s.policy_version == v) for v in range(VERSIONS)
    ]
    assert xs == list(np.cumsum(per_version))
    files, _ = export_runs(sweep["services"], [job.id], "reward_mean", "wall time", 0)
    with open(files[0], newline="") as file:
        xs = [float(r["x"]) for r in csv.DictReader(file) if r["series"] == "run"]
    created = [v.created_at for v in repo.list_versions(job.id)]
    assert xs == pytest.approx([(t - created[0]).total_seconds() for t in created], abs=1e-3)


def test_points_of_several_seeds_get_a_band_and_the_method_is_stated(sweep):
    plot, *_ = runs_view(sweep["services"], sweep["ids"], "reward_mean", "version", 0.5)
    assert plot.count('class="run-band"') == len(LRS)  # not the one-seed point
    assert 'class="run-band" data-point="lr=0.1"' not in plot
    assert plot.count('class="run-mean"') == len(LRS) + 1
    assert "95% percentile bootstrap" in plot and "with bias correction" in plot
    assert "lr=0.001 (3 seeds · mean with 95% band)" in plot


def test_config_differences_are_marked_and_the_common_part_folded(sweep):
    *_, configs, _ = runs_view(sweep["services"], sweep["ids"][:4], "reward_mean", "version", 0)
    assert "<th>lr</th><th>seed</th>" in configs
    assert "<td><mark>0.01</mark></td>" in configs  # one run of four has another lr
    assert "<details class='runs-common'><summary>Common to all 4 runs (3 settings)" in configs
    assert "<td>task</td><td>&quot;always7&quot;</td>" in configs


def test_the_metrics_offered_are_those_recorded(sweep):
    names, first = metric_choices(sweep["services"], sweep["ids"])
    assert set(names) == {"reward_mean", "kl", "generate_s", "heldout_accuracy"}
    assert first == "reward_mean"


@pytest.mark.parametrize(
    ("selection", "metric", "axis", "smoothing", "problem"),
    [
        ([], "reward_mean", "version", 0, "choose one or more train jobs"),
        ([10**9], "reward_mean", "version", 0, "no such job"),
        (["x"], "reward_mean", "version", 0, "is not a number"),
        (None, "", "version", 0, "choose a metric"),
        (None, "reward_mean", "steps", 0, "x axis: choose one of"),
        (None, "reward_mean", "version", 1.5, "smoothing: 1.5 is outside"),
    ],
)
def test_bad_choices_are_refused_with_the_reason(
    sweep, selection, metric, axis, smoothing, problem
):
    chosen = sweep["ids"][:2] if selection is None else selection
    plot, points, runs, _, note = runs_view(sweep["services"], chosen, metric, axis, smoothing)
    assert plot == "" and points.empty and runs.empty
    assert problem in note.replace("\\", "")
    files, message = export_runs(sweep["services"], chosen, metric, axis, smoothing)
    assert files is None and problem in message.replace("\\", "")


def test_only_train_jobs_and_a_bounded_selection(sweep):
    repo, services = sweep["repo"], sweep["services"]
    compare = repo.create_job("compare", {"job_id": sweep["ids"][0], "versions": [0, 1]})
    with pytest.raises(ValueError, match=f"#{compare.id} is a compare job"):
        runs_for_selection(services, [sweep["ids"][0], compare.id])
    with pytest.raises(ValueError, match="at most 200 jobs"):
        runs_for_selection(services, list(range(1, 202)))


def test_exports_hold_the_view(sweep):
    services, ids = sweep["services"], sweep["ids"]
    _, points, runs, _, _ = runs_view(services, ids, "heldout_accuracy", "version", 0)
    files, message = export_runs(services, ids, "heldout_accuracy", "version", 0)
    assert [Path(f).name for f in files] == [
        "runs-heldout_accuracy.csv",
        "runs-heldout_accuracy.png",
        "runs-points.csv",
        "runs-runs.csv",
    ]
    assert Path(files[1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(files[3], newline="") as file:
        exported = list(csv.DictReader(file))
    assert [int(r["job"]) for r in exported] == list(runs["job"])
    assert [float(r["final held-out"]) for r in exported] == list(runs["final held-out"])
    with open(files[2], newline="") as file:
        assert [r["point"] for r in csv.DictReader(file)] == list(points["point"])
    assert message == f"Exported {len(ids)} runs."


def test_a_study_picks_its_jobs(tmp_path):
    """The study picker lists a study and picking it selects exactly its jobs (not the other
    train jobs of the database); an unknown study is refused by its id."""
    repo = new_repository(tmp_path)
    try:
        services = FakeQueue(repo).services((tmp_path,), tmp_path / "data")
        other = repo.create_job("train", {"model": "m", "task": "always7"})
        study = repo.create_study(
            "lrs",
            "grid",
            {"task": "always7"},
            {"lr": [0.1, 0.2]},
            seeds=1,
            max_jobs=2,
            concurrency=2,
        )

        def plan(info, made, room):
            return [
                StudyJobRecord({"model": "m", "task": "always7", "lr": lr}, {"lr": lr})
                for lr in (0.1, 0.2)[made : made + room]
            ]

        _, jobs = repo.schedule_study(study.id, plan)
        assert [label for label, _ in study_choices(services)] == ["lrs (running, 2 jobs)"]
        picked = study_runs(services, study.id)
        assert sorted(picked) == sorted(job.id for job in jobs) and other.id not in picked
        with pytest.raises(InvalidValue, match="no study has the id"):
            study_runs(services, study.id + 1)
    finally:
        repo.close()


def test_draws_of_the_view_run_one_at_a_time_in_the_order_asked(sweep, monkeypatch):
    """Picking a job draws the view and so does the metric the pick sets, each from an event of
    its own. The app (queued as `ui.app.launch` queues it, four events at a time) runs them one
    at a time in the order asked, so the newest selection is the last drawn: the first draw is
    held until a second draw either starts beside it (the failure) or waits behind it."""
    demo = ui_app.build_app(sweep["services"])
    demo.queue(default_concurrency_limit=4).launch(prevent_thread_lock=True, quiet=True)
    log = []  # ("start" | "end", job ids) of every draw, as they happen

    def second_draw_seen() -> bool:
        waiting = demo._queue.event_queue_per_concurrency_id.values()
        return len(log) > 1 or any(queue.queue for queue in waiting)

    def held_draw(services, job_ids, *rest):
        log.append(("start", job_ids))
        give_up = time.monotonic() + 300  # only a guard against hanging the suite
        while not second_draw_seen() and time.monotonic() < give_up:
            time.sleep(0.01)
        try:
            return runs_view(services, job_ids, *rest)
        finally:
            log.append(("end", job_ids))

    monkeypatch.setattr(runs_tab, "runs_view", held_draw)
    older, newer = sweep["ids"][:3], sweep["ids"]
    try:
        client = Client(demo.local_url, verbose=False)
        first = client.submit(older, "reward_mean", "version", 0, api_name="/runs_metric")
        while not log and not first.done():  # a failed call raises at its result
            time.sleep(0.01)
        second = client.submit(newer, "reward_mean", "version", 0, api_name="/runs_picked")
        first.result(), second.result()
    finally:
        demo.close()
    assert log == [("start", older), ("end", older), ("start", newer), ("end", newer)]
