"""Runs tab: several train jobs side by side. Pick a study's jobs or any jobs; overlay a
metric against version, tokens or wall time, runs grouped into points by their configs (seeds
as mean and band); the final held-out scores per point with confidence intervals, speed and
cost; exports."""

import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from pathlib import Path

import pandas as pd

from db import InvalidValue, JobInfo, JobKind, StudyNotFound
from ui.handlers.common import parse_id, parse_number
from ui.render import inert
from ui.run_plot import curves_png, curves_svg
from ui.run_tables import (
    POINT_COLUMNS,
    RUN_COLUMNS,
    points_table,
    run_facts,
    runs_table,
    score_note,
)
from ui.runs import (
    X_AXES,
    ConfigSplit,
    Curve,
    curves_frame,
    method_note,
    point_curve,
    points,
    split_configs,
)
from ui.services import Services
from workers.api import HELDOUT_METRIC, worker_device

MAX_RUNS = 200  # jobs one view reads
RUN_CHOICES = 200  # train jobs the picker offers (any other id may be typed)
MAX_SMOOTHING = 0.99
DEFAULT_METRIC = "reward_mean"


def run_choices(services: Services) -> list[tuple[str, int]]:
    """(label, id) of the newest train jobs, for the picker."""
    return [
        (f"#{job.id} ({job.status.value})", job.id)
        for job in services.repository.list_jobs(limit=RUN_CHOICES, kind="train")
    ]


def study_choices(services: Services) -> list[tuple[str, int]]:
    """(label, id) of the studies, for the study picker."""
    return [
        (f"{study.name} ({study.status.value}, {sum(study.job_counts.values())} jobs)", study.id)
        for study in services.repository.list_studies()
    ]


def study_runs(services: Services, study: float | str | None) -> list[int]:
    """The train jobs of a study, to pick them all (`InvalidValue` for an unknown study)."""
    study_id = parse_id(study, "study")
    if study_id is None:
        return []
    try:
        services.repository.get_study(study_id)
    except StudyNotFound as exc:
        raise InvalidValue(str(exc)) from None
    return [job.id for job in services.repository.study_jobs(study_id)][:MAX_RUNS]


def runs_for_selection(services: Services, job_ids: list[float | str] | None) -> list[JobInfo]:
    """The runs a selection names, in the order given: here the jobs picked one by one. The
    one place a selection becomes jobs (`InvalidValue` for an empty, oversized or unknown
    selection, or one naming a job that is not a train job)."""
    ids = [i for i in (parse_id(value, "job") for value in job_ids or []) if i is not None]
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise InvalidValue("choose one or more train jobs")
    if len(ids) > MAX_RUNS:
        raise InvalidValue(f"choose at most {MAX_RUNS} jobs (got {len(ids)})")
    jobs = services.repository.get_jobs(ids)
    missing = sorted(set(ids) - {job.id for job in jobs})
    if missing:
        raise InvalidValue(f"no such job: {', '.join(f'#{i}' for i in missing)}")
    other = [
        f"#{job.id} is a {job.kind.value} job" for job in jobs if job.kind is not JobKind.TRAIN
    ]
    if other:
        raise InvalidValue(f"the Runs view compares train jobs: {'; '.join(other)}")
    return jobs


def metric_choices(services: Services, job_ids: list[float | str] | None) -> tuple[list[str], str]:
    """The metrics the selected runs recorded, and the one to show first (the trainer's
    reward mean when recorded; the current message instead of names on a bad selection)."""
    try:
        jobs = runs_for_selection(services, job_ids)
    except InvalidValue:
        return [], ""
    names = services.repository.run_metric_names([job.id for job in jobs])
    return names, DEFAULT_METRIC if DEFAULT_METRIC in names else (names[0] if names else "")


@dataclass(frozen=True)
class RunsView:
    curves: list[Curve]
    points: pd.DataFrame
    runs: pd.DataFrame
    split: ConfigSplit
    x_title: str
    y_title: str
    note: str


def _smoothing(value: float | str | None) -> float:
    weight = parse_number(value, "smoothing") or 0.0
    if not 0 <= weight <= MAX_SMOOTHING:
        raise InvalidValue(f"smoothing: {weight:g} is outside 0..{MAX_SMOOTHING}")
    return weight


def build_view(
    services: Services,
    job_ids: list[float | str] | None,
    metric: str | None,
    x_axis: str | None,
    smoothing: float | str | None,
) -> RunsView:
    """The curves of ``metric`` and the tables of the selected runs: one query across all
    of them for the metric (every version), one for their final held-out scores (each run's
    newest versions only), one for their tokens (and one more for each version's tokens when
    they are the x axis)."""
    jobs = runs_for_selection(services, job_ids)
    if not metric:
        raise InvalidValue("choose a metric")
    if x_axis not in X_AXES:
        raise InvalidValue(f"x axis: choose one of {', '.join(X_AXES)}")
    weight = _smoothing(smoothing)
    ids = [job.id for job in jobs]
    repository = services.repository
    values = repository.run_metrics(ids, [metric])[metric]
    finals = repository.final_values(ids, HELDOUT_METRIC)
    tokens = repository.run_tokens(ids) if x_axis == "tokens" else {}
    split = split_configs(jobs)
    grouped = points(jobs, split)
    curves = [
        curve
        for point, members in grouped.items()
        if (curve := point_curve(point, members, values, tokens, x_axis, weight)) is not None
    ]
    facts = run_facts(grouped, finals, values, repository.token_totals(ids), datetime.now(UTC))
    return RunsView(
        curves,
        points_table(facts),
        runs_table(facts, worker_device()),
        split,
        X_AXES[x_axis],
        metric,
        method_note(weight),
    )


def config_html(split: ConfigSplit) -> str:
    """The settings that differ between the runs (a cell is marked where it differs from the
    value most runs have), and the common part folded."""
    if split.differing:
        head = "".join(f"<th>{escape(key)}</th>" for key in split.differing)
        usual = {
            key: Counter(config.get(key) for config in split.runs.values()).most_common(1)[0][0]
            for key in split.differing
        }
        rows = []
        for job, config in split.runs.items():
            cells = []
            for key in split.differing:
                value = escape(config.get(key, "unset"))
                marked = config.get(key) != usual[key]
                cells.append(f"<td>{f'<mark>{value}</mark>' if marked else value}</td>")
            rows.append(f"<tr><td>#{job}</td>{''.join(cells)}</tr>")
        differing = f'<table class="runs-diff"><tr><th>job</th>{head}</tr>{"".join(rows)}</table>'
    else:
        differing = "<p>The runs' configs are identical.</p>"
    common = "".join(
        f"<tr><td>{escape(key)}</td><td>{escape(value)}</td></tr>"
        for key, value in split.common.items()
    )
    return (
        f"{differing}<details class='runs-common'><summary>Common to all {len(split.runs)} "
        f"runs ({len(split.common)} settings)</summary><table>{common}</table></details>"
    )


RunsOutputs = tuple[str, pd.DataFrame, pd.DataFrame, str, str]


def runs_view(
    services: Services,
    job_ids: list[float | str] | None,
    metric: str | None,
    x_axis: str | None,
    smoothing: float | str | None,
) -> RunsOutputs:
    """(the plot, the points table, the runs table, the config differences, a note): the
    view of `build_view`, or empty tables and the reason nothing is shown."""
    try:
        view = build_view(services, job_ids, metric, x_axis, smoothing)
    except InvalidValue as exc:
        empty = pd.DataFrame(columns=POINT_COLUMNS), pd.DataFrame(columns=RUN_COLUMNS)
        return "", *empty, "", f"**{inert(exc)}**"
    return (
        curves_svg(view.curves, view.x_title, view.y_title, view.note),
        view.points,
        view.runs,
        config_html(view.split),
        score_note(HELDOUT_METRIC),
    )


def export_runs(
    services: Services,
    job_ids: list[float | str] | None,
    metric: str | None,
    x_axis: str | None,
    smoothing: float | str | None,
) -> tuple[list[str] | None, str]:
    """The view written to fresh files (the curves as CSV and PNG, both tables as CSV) and a
    note; no files and the reason when there is no view."""
    try:
        view = build_view(services, job_ids, metric, x_axis, smoothing)
    except InvalidValue as exc:
        return None, f"**Nothing exported:** {inert(exc)}"
    folder = Path(tempfile.mkdtemp(prefix="rlwb-runs-"))
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in view.y_title)
    curves_frame(view.curves).to_csv(folder / f"runs-{name}.csv", index=False)
    view.points.to_csv(folder / "runs-points.csv", index=False)
    view.runs.to_csv(folder / "runs-runs.csv", index=False)
    png = curves_png(
        view.curves, view.x_title, view.y_title, view.note, folder / f"runs-{name}.png"
    )
    files = [folder / f"runs-{name}.csv", png, folder / "runs-points.csv", folder / "runs-runs.csv"]
    return [str(path) for path in files], f"Exported {len(view.runs)} runs."
