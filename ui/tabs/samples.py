"""Samples tab: filters, a paginated table, rejected batches and the token-level view."""

from functools import partial
from typing import Any

import gradio as gr

from ui.handlers.audit import audit_view
from ui.handlers.jobs import batches_table
from ui.handlers.samples import (
    ANY,
    EPISODE_FINISH_CHOICES,
    FINISH_CHOICES,
    STATUS_CHOICES,
    batch_samples,
    component_choices,
    open_sample,
    rejected_batches,
    sample_detail,
    search_samples,
    turn_page,
)
from ui.sample_rows import samples_frame
from ui.services import Services
from ui.tabs.common import first_cell, job_picker, refresh_jobs
from ui.token_versions import COLOUR_CHOICES, LOGPROB


def _components(services: Services, job_id: Any) -> dict:
    return gr.update(choices=component_choices(services, job_id), value=None)


def build(services: Services, tab: gr.Tab) -> None:
    """The Samples tab's components and events (inside ``tab``)."""
    with gr.Row():
        job = job_picker(services, "samples-job")
        min_version = gr.Textbox(label="Min version", placeholder="any")
        max_version = gr.Textbox(label="Max version", placeholder="any")
        finish = gr.Dropdown(FINISH_CHOICES, value=ANY, label="Finish reason")
        error_code = gr.Textbox(label="Error code", placeholder="e.g. kv_exhausted")
    with gr.Row():
        min_reward = gr.Textbox(label="Min reward", placeholder="any")
        max_reward = gr.Textbox(label="Max reward", placeholder="any")
        status = gr.Dropdown(STATUS_CHOICES, value=ANY, label="Batch")
        text = gr.Textbox(label="Text in prompt or response", scale=2)
        min_gap = gr.Textbox(
            label="Min |log ratio|",
            placeholder="any",
            info="trained samples with a token whose |trainer − behaviour| log-prob is at least",
            elem_id="samples-min-gap",
        )
        component = gr.Dropdown(
            [],
            value=None,
            allow_custom_value=True,
            label="Reward component",
            info="a reward of the job's list",
            elem_id="samples-component",
        )
        min_component = gr.Textbox(
            label="Component ≥", placeholder="any", elem_id="samples-min-component"
        )
        newest_first = gr.Checkbox(label="Newest first")
    with gr.Row():  # multi-turn episodes (a job with an environment); single turns match "any"
        episode_finish = gr.Dropdown(
            EPISODE_FINISH_CHOICES,
            value=ANY,
            label="Episode finish",
            info="how a multi-turn episode ended",
            elem_id="samples-episode-finish",
        )
        min_turns = gr.Textbox(
            label="Min turns",
            placeholder="any",
            info="episodes of at least this many assistant turns",
            elem_id="samples-min-turns",
        )
        with_tool_errors = gr.Checkbox(
            label="With tool errors",
            info="episodes with a turn whose tool call could not be parsed",
            elem_id="samples-tool-errors",
        )
    with gr.Row():
        search = gr.Button("Search", variant="primary", elem_id="samples-search")
        previous = gr.Button("◀ Previous", elem_id="samples-previous")
        following = gr.Button("Next ▶", elem_id="samples-next")
        info = gr.Markdown(elem_id="samples-info")
    page_state = gr.State({})
    table = gr.Dataframe(
        samples_frame([]),
        label="Samples (click a row to open it)",
        interactive=False,
        elem_id="samples-table",
    )
    with gr.Accordion("Rejected batches", open=False):
        rejected = gr.Dataframe(
            batches_table([]),
            label="Click a batch to list its samples",
            interactive=False,
            elem_id="rejected",
        )
        batch_id = gr.Textbox(label="Batch", visible=False)
    with gr.Row(equal_height=True):  # as tall as the id's box: no label above it
        sample_id = gr.Textbox(
            label="Sample id",
            show_label=False,
            placeholder="Sample id",
            container=False,
            elem_id="sample-id",
        )
        open_button = gr.Button("Open sample", elem_id="sample-open")
        audit = gr.Button("Audit (re-score under its version)", elem_id="sample-audit-button")
        colour_by = gr.Radio(
            COLOUR_CHOICES,
            value=LOGPROB,
            label="Colour by",
            info="version: which policy version sampled each token",
            elem_id="sample-colour-by",
        )
    audit_result = gr.Markdown(elem_id="sample-audit")
    detail = gr.HTML(elem_id="sample-detail")

    filters = [
        job,
        min_version,
        max_version,
        finish,
        error_code,
        min_reward,
        max_reward,
        status,
        text,
        newest_first,
        min_gap,
        component,
        min_component,
        episode_finish,
        min_turns,
        with_tool_errors,
    ]
    page = [table, page_state, info]
    show_detail = partial(open_sample, services)
    show_rejected = partial(rejected_batches, services)

    tab.select(partial(refresh_jobs, services), None, job, api_name="samples_jobs")
    job.change(show_rejected, job, rejected, api_name="rejected_batches")
    job.change(partial(_components, services), job, component, api_name="samples_components")
    search.click(partial(search_samples, services), filters, page, api_name="samples")
    previous.click(
        partial(turn_page, services, step=-1), page_state, page, api_name="samples_previous"
    )
    following.click(partial(turn_page, services, step=1), page_state, page, api_name="samples_next")
    rejected.select(first_cell, None, batch_id, api_name="rejected_pick").then(
        partial(batch_samples, services), [job, batch_id], page, api_name="batch_samples"
    )
    chosen = [sample_id, colour_by]
    table.select(first_cell, None, sample_id, api_name="samples_pick").then(
        show_detail, chosen, [detail, audit_result], api_name="sample_picked"
    )
    open_button.click(show_detail, chosen, [detail, audit_result], api_name="sample")
    colour_by.change(partial(sample_detail, services), chosen, detail, api_name="sample_colour")
    audit.click(partial(audit_view, services), sample_id, audit_result, api_name="audit")
