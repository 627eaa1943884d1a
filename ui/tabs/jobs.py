"""Jobs tab: the live job table, cancel, resume, clone, and a job's page with plots over
versions (EMA over faint raw values; "no data yet" instead of empty axes), and its metrics
as CSV."""

from functools import partial
from typing import Any

import gradio as gr

from ui.handlers.clone import clone_form
from ui.handlers.export import metrics_csv
from ui.handlers.jobs import (
    batches_table,
    cancel_job,
    job_batches,
    job_page,
    jobs_table,
    resume_job,
)
from ui.plots import PLOTS, X_FORMAT, PlotSpec, shown
from ui.services import Services
from ui.tabs.common import first_cell

TABLE_REFRESH_S = 2.0
PAGE_REFRESH_S = 5.0
PLOT_ROWS = (
    ("reward", "heldout"),
    ("length", "kl"),
    ("mismatch", "batches"),
    ("reward-components",),
    ("policy-lag", "importance"),
    ("pipeline-time", "episodes"),
)
# job, kind, devices, status, progress (a phase or an ETA is long), version, reward, tokens/s,
# created: long cells wrap within these, so the table fits the page
JOB_COLUMN_WIDTHS = ["5%", "7%", "9%", "9%", "28%", "7%", "7%", "8%", "20%"]


def _plot(spec: PlotSpec) -> tuple[gr.LinePlot, gr.Markdown]:
    """A plot and the note shown in its place while it has no data."""
    plot = gr.LinePlot(
        x="version",
        y="value",
        color="series",
        title=spec.title,
        y_title=spec.y_title,
        color_map=spec.colours() or None,  # reward components: colours chosen by the plot
        x_axis_format=X_FORMAT,
        y_axis_format=spec.y_format,
        height=260,
        visible=False,
        elem_id=f"plot-{spec.key}",
    )
    note = gr.Markdown(f"**{spec.title}**: no data yet", elem_id=f"plot-{spec.key}-empty")
    return plot, note


def _page_updates(services: Services, job_id: Any) -> list[Any]:
    """The page's outputs: summary, config, then per plot its frame and its note."""
    summary, config, frames, hidden = job_page(services, job_id)
    updates: list[Any] = [summary, config]
    for spec, frame in zip(PLOTS, frames, strict=True):
        plot, note = shown(spec, frame, hidden)
        updates.append(gr.update(value=frame, visible=plot))
        updates.append(gr.update(visible=note))
    return updates


def _clone(services: Services, fields: list[str], job_id: Any) -> list[Any]:
    values, message = clone_form(services, job_id)
    if not values:
        return [gr.update() for _ in fields] + [message, gr.update()]
    return [values[name] for name in fields] + [message, gr.Tabs(selected="launch")]


def _export(services: Services, job_id: Any) -> dict:
    """The job's metrics as a CSV file, shown once there is one."""
    path = metrics_csv(services, job_id)
    return gr.update(value=path, visible=path is not None)


def build(services: Services, form: dict[str, gr.components.Component], tabs: gr.Tabs) -> None:
    """The Jobs tab's components and events (inside a ``gr.Tab``); "Clone" fills ``form``
    (the Launch tab's fields) and switches ``tabs`` to Launch."""
    table_timer = gr.Timer(TABLE_REFRESH_S)
    page_timer = gr.Timer(PAGE_REFRESH_S)
    table = gr.Dataframe(
        jobs_table(services),
        label="Jobs (newest first; click a row to open it)",
        interactive=False,
        wrap=True,
        column_widths=JOB_COLUMN_WIDTHS,
        elem_id="jobs-table",
    )
    with gr.Row(equal_height=True):  # as tall as the id's box: no label above it
        job_id = gr.Textbox(
            label="Job id",
            show_label=False,
            placeholder="Job id",
            container=False,
            elem_id="job-id",
            min_width=100,
            scale=1,
        )
        open_job = gr.Button("Open", size="sm", elem_id="job-open", scale=0, min_width=90)
        clone = gr.Button("Clone job", size="sm", elem_id="job-clone", scale=0, min_width=110)
        resume = gr.Button("Resume", size="sm", elem_id="job-resume", scale=0, min_width=90)
        cancel = gr.Button(
            "Cancel job", variant="stop", size="sm", elem_id="job-cancel", scale=0, min_width=110
        )
        refresh = gr.Button("Refresh table", size="sm", scale=0, min_width=120)
    message = gr.Markdown(elem_id="job-message")
    summary = gr.Markdown(elem_id="job-summary")
    plots: dict[str, tuple[gr.LinePlot, gr.Markdown]] = {}
    specs = {spec.key: spec for spec in PLOTS}
    for row in PLOT_ROWS:
        with gr.Row():
            for key in row:
                with gr.Column():
                    plots[key] = _plot(specs[key])
    with gr.Row():
        export = gr.Button("Export metrics (CSV)", size="sm", elem_id="job-export", scale=0)
        csv_file = gr.File(
            label="Metrics per version", elem_id="job-csv", height=60, scale=3, visible=False
        )
    batches = gr.Dataframe(
        batches_table([]), label="Rollout batches", interactive=False, elem_id="job-batches"
    )
    with gr.Accordion("Config", open=False):
        config = gr.JSON()

    page_outputs = [summary, config] + [c for spec in PLOTS for c in plots[spec.key]]
    show_page = partial(_page_updates, services)
    show_batches = partial(job_batches, services)
    refresh_table = partial(jobs_table, services)
    fields = list(form)

    table_timer.tick(refresh_table, None, table, api_name="jobs_live", show_progress="hidden")
    page_timer.tick(show_page, job_id, page_outputs, api_name="job_live", show_progress="hidden")
    refresh.click(refresh_table, None, table, api_name="jobs")
    table.select(first_cell, None, job_id, api_name="jobs_pick").then(
        show_page, job_id, page_outputs, api_name="job_picked"
    ).then(show_batches, job_id, batches, api_name="job_picked_batches")
    open_job.click(show_page, job_id, page_outputs, api_name="job").then(
        show_batches, job_id, batches, api_name="job_batches"
    )
    cancel.click(partial(cancel_job, services), job_id, message, api_name="cancel").then(
        refresh_table, None, table, api_name="jobs_after_cancel"
    )
    resume.click(partial(resume_job, services), job_id, message, api_name="resume").then(
        refresh_table, None, table, api_name="jobs_after_resume"
    )
    clone.click(
        partial(_clone, services, fields),
        job_id,
        [form[name] for name in fields] + [message, tabs],
        api_name="clone",
    )
    export.click(partial(_export, services), job_id, csv_file, api_name="job_csv")
