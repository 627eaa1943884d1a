"""Runs tab: pick a study's train jobs or any; a metric's curves (points of seeds as mean and
band), the final held-out scores per point and per run, the config differences, and exports."""

from functools import partial

import gradio as gr
import pandas as pd
from pandas.io.formats.style import Styler

from db import InvalidValue
from ui.handlers.runs import (
    MAX_SMOOTHING,
    export_runs,
    metric_choices,
    run_choices,
    runs_view,
    study_choices,
    study_runs,
)
from ui.render import inert
from ui.run_tables import POINT_COLUMNS, RUN_COLUMNS
from ui.runs import X_AXES
from ui.services import Services


def _jobs(services: Services) -> tuple[dict, dict]:
    """The pickers with the current studies and train jobs (their values are left alone)."""
    return gr.update(choices=study_choices(services)), gr.update(choices=run_choices(services))


def _study(services: Services, study: int | None) -> tuple[dict, str]:
    """A study picked: its jobs become the selection."""
    try:
        return gr.update(value=study_runs(services, study)), ""
    except InvalidValue as exc:
        return gr.update(), f"**{inert(exc)}**"


def _metrics(services: Services, job_ids: list[int] | None, current: str | None) -> dict:
    """The metrics the runs recorded, the current one kept when they have it."""
    names, first = metric_choices(services, job_ids)
    return gr.update(choices=names, value=current if current in names else first or None)


# How the tables show their numbers (exports and the API keep them whole).
SHOWN = {
    "final held-out (mean)": "{:.4f}",
    "95% CI low": "{:.4f}",
    "95% CI high": "{:.4f}",
    "final held-out": "{:.4f}",
    "steps/min": "{:.1f}",
    "device·s": "{:.1f}",
}


def _shown(table: pd.DataFrame) -> Styler:
    return table.style.format({c: f for c, f in SHOWN.items() if c in table.columns}, na_rep="")


def _draw(services: Services, *view: object) -> tuple:
    """`runs_view`, its tables' numbers rounded for the page."""
    plot, points, runs, configs, message = runs_view(services, *view)
    return plot, _shown(points), _shown(runs), configs, message


def _export(services: Services, *view: object) -> tuple[dict, str]:
    files, message = export_runs(services, *view)
    return gr.update(value=files, visible=files is not None), message


# The events that change the selection or draw the view run one at a time, in the order they
# were asked: picking a job sets the metric, which draws again, beside the pick's own draw; run
# side by side, an older draw could finish last and leave the page showing an older selection.
IN_ORDER = {"concurrency_id": "runs-view", "concurrency_limit": 1}


def build(services: Services, tab: gr.Tab) -> None:
    """The Runs tab's components and events (inside ``tab``)."""
    with gr.Row(equal_height=True):
        study = gr.Dropdown(
            study_choices(services),
            value=None,
            label="Study (picks its jobs)",
            elem_id="runs-study",
            scale=2,
        )
        jobs = gr.Dropdown(
            run_choices(services),
            value=[],
            multiselect=True,
            allow_custom_value=True,
            label="Runs (train jobs)",
            elem_id="runs-jobs",
            scale=4,
        )
        metric = gr.Dropdown(
            [], allow_custom_value=True, label="Metric", elem_id="runs-metric", scale=2
        )
        x_axis = gr.Radio(list(X_AXES), value="version", label="x axis", elem_id="runs-x", scale=2)
        smoothing = gr.Slider(
            0,
            MAX_SMOOTHING,
            value=0,
            step=0.01,
            label="Smoothing (debiased EMA; 0 = none)",
            elem_id="runs-smoothing",
            scale=2,
        )
        show = gr.Button("Show", variant="primary", elem_id="runs-show", scale=0, min_width=90)
    message = gr.Markdown(elem_id="runs-message")
    plot = gr.HTML(elem_id="runs-plot")
    points = gr.Dataframe(
        pd.DataFrame(columns=POINT_COLUMNS),
        label="Final held-out score per point",
        interactive=False,
        elem_id="runs-points",
    )
    runs = gr.Dataframe(
        pd.DataFrame(columns=RUN_COLUMNS),
        label="Runs",
        interactive=False,
        elem_id="runs-runs",
    )
    gr.Markdown("#### Config differences")
    configs = gr.HTML(elem_id="runs-configs")
    with gr.Row():
        export = gr.Button("Export curves and tables (CSV, PNG)", size="sm", elem_id="runs-export")
        files = gr.File(
            label="Exports", file_count="multiple", elem_id="runs-files", visible=False, scale=3
        )

    view = [jobs, metric, x_axis, smoothing]
    outputs = [plot, points, runs, configs, message]
    draw = partial(_draw, services)
    quiet = {"show_progress": "hidden", **IN_ORDER}
    tab.select(partial(_jobs, services), None, [study, jobs], api_name="runs_jobs")
    study.input(
        partial(_study, services), study, [jobs, message], api_name="runs_study", **IN_ORDER
    )
    jobs.change(
        partial(_metrics, services), [jobs, metric], metric, api_name="runs_metrics", **IN_ORDER
    ).then(draw, view, outputs, api_name="runs_picked", **quiet)
    show.click(draw, view, outputs, api_name="runs", **IN_ORDER)
    metric.change(draw, view, outputs, api_name="runs_metric", **quiet)
    x_axis.change(draw, view, outputs, api_name="runs_x_axis", **quiet)
    smoothing.release(draw, view, outputs, api_name="runs_smoothing", **quiet)
    export.click(partial(_export, services), view, [files, message], api_name="runs_export")
