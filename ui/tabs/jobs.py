"""Jobs tab: the live job table, cancel, resume, and a job's page with plots over versions."""

from functools import partial

import gradio as gr

from ui.handlers.jobs import (
    batches_table,
    cancel_job,
    job_batches,
    job_page,
    jobs_table,
    resume_job,
)
from ui.services import Services
from ui.tabs.common import first_cell

TABLE_REFRESH_S = 2.0
PAGE_REFRESH_S = 5.0


def _plot(title: str, y_title: str) -> gr.LinePlot:
    return gr.LinePlot(
        x="version", y="value", color="series", title=title, y_title=y_title, height=260
    )


def build(services: Services) -> None:
    """The Jobs tab's components and events (inside a ``gr.Tab``)."""
    table_timer = gr.Timer(TABLE_REFRESH_S)
    page_timer = gr.Timer(PAGE_REFRESH_S)
    table = gr.Dataframe(
        jobs_table(services),
        label="Jobs (newest first; click a row to open it)",
        interactive=False,
        elem_id="jobs-table",
    )
    with gr.Row(equal_height=True):
        job_id = gr.Textbox(label="Job id", elem_id="job-id", min_width=100)
        with gr.Column(min_width=120):
            open_job = gr.Button("Open", size="sm", elem_id="job-open")
            cancel = gr.Button("Cancel job", variant="stop", size="sm", elem_id="job-cancel")
            resume = gr.Button("Resume", size="sm", elem_id="job-resume")
        refresh = gr.Button("Refresh table", size="sm", min_width=120)
        message = gr.Markdown(elem_id="job-message")
    summary = gr.Markdown(elem_id="job-summary")
    with gr.Row():
        reward = _plot("Reward", "reward")
        length = _plot("Response length", "tokens")
    with gr.Row():
        kl = _plot("KL to the reference", "KL")
        mismatch = _plot("Train/infer log-prob mismatch", "mean |Δ log-prob|")
    batches_plot = _plot("Rollout batches", "batches")
    batches = gr.Dataframe(
        batches_table([]), label="Rollout batches", interactive=False, elem_id="job-batches"
    )
    with gr.Accordion("Config", open=False):
        config = gr.JSON()

    page_outputs = [summary, config, reward, length, kl, mismatch, batches_plot]
    show_page = partial(job_page, services)
    show_batches = partial(job_batches, services)
    refresh_table = partial(jobs_table, services)

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
