"""Compare tab: pick a job and two versions (version B of another job on the same tokenizer,
if chosen); metrics, distributions, responses side by side,
the held-out comparison, and the token-level diff of one response under both versions."""

from functools import partial

import gradio as gr
import pandas as pd

from ui.handlers.compare import (
    METRIC_COLUMNS,
    compare_versions,
    default_versions,
    follow_compare_job,
    job_task,
    launch_compare,
    newest_job_with_samples,
    version_choices,
)
from ui.handlers.jobs import job_choices
from ui.handlers.token_diff import token_diff_view
from ui.services import Services
from ui.tabs.common import job_picker, refresh_jobs
from workers import api

COMPARE_JOB_POLL_S = 2.0


def _jobs(services: Services, current: int | str | None) -> dict:
    """The job picker with the current jobs, set to the newest job with samples if none is
    chosen yet (so the tab never opens on an empty view)."""
    chosen = current if current not in (None, "") else newest_job_with_samples(services)
    return gr.update(choices=job_choices(services), value=chosen)


def _versions(services: Services, job_id: int | None, job_b: int | None) -> tuple[dict, dict, dict]:
    """Version pickers for a job, set to the versions that have data (`default_versions`;
    version B of job B when one is chosen, its newest), and the held-out comparison's task
    set to the job's."""
    versions = version_choices(services, job_id)
    a, b = default_versions(services, job_id)
    task = job_task(services, job_id)
    versions_b = versions
    if job_b not in (None, "") and job_b != job_id:
        versions_b = version_choices(services, job_b)
        b = versions_b[-1] if versions_b else None
    return (
        gr.update(choices=versions, value=a),
        gr.update(choices=versions_b, value=b),
        gr.update() if task is None else gr.update(value=task),
    )


def _launch(services: Services, *form: object) -> tuple[str, int | list[int] | None, gr.Timer]:
    """Queue a compare job (`launch_compare`) and follow it while it runs."""
    message, launched = launch_compare(services, *form)
    return message, launched, gr.Timer(active=launched is not None)


def _follow(
    services: Services, outputs: int, launched: int | list[int] | None, *view: object
) -> tuple[object, ...]:
    """The launched compare job's status, and the comparison on view (its ``outputs``) once
    the job has succeeded (`follow_compare_job`); the polling stops once it has finished."""
    unchanged = (gr.update(),) * outputs
    if launched is None:
        return gr.update(), gr.Timer(active=False), *unchanged
    message, finished, comparison = follow_compare_job(services, launched, *view)
    return message, gr.Timer(active=not finished), *(comparison or unchanged)


def build(services: Services, tab: gr.Tab) -> None:
    """The Compare tab's components and events (inside ``tab``)."""
    with gr.Row():
        job = job_picker(services, "compare-job")
        version_a = gr.Dropdown([], allow_custom_value=True, label="Version A", elem_id="compare-a")
        version_b = gr.Dropdown([], allow_custom_value=True, label="Version B", elem_id="compare-b")
        job_b = gr.Dropdown(
            job_choices(services),
            value=None,
            allow_custom_value=True,
            label="Job B (optional: another job on the same tokenizer)",
            elem_id="compare-job-b",
            scale=2,
        )
        run = gr.Button("Compare", variant="primary", elem_id="compare-button")
    metrics = gr.Dataframe(
        pd.DataFrame(columns=METRIC_COLUMNS),
        label="Metrics",
        interactive=False,
        elem_id="compare-metrics",
    )
    with gr.Row():
        rewards = gr.HTML(elem_id="compare-rewards")
        lengths = gr.HTML(elem_id="compare-lengths")
    side_by_side = gr.HTML(elem_id="compare-pairs")
    gr.Markdown("#### Held-out comparison: both versions answer the same prompts (greedy)")
    with gr.Row(equal_height=True):
        task = gr.Dropdown(
            list(api.TASKS), value="addition", label="Task", min_width=140, elem_id="compare-task"
        )
        num_prompts = gr.Number(64, label="Prompts", precision=0, min_width=100)
        seed = gr.Number(1, label="Held-out seed", precision=0, min_width=100)
        max_tokens = gr.Number(16, label="Max tokens", precision=0, min_width=100)
    with gr.Row(equal_height=True):
        launch = gr.Button("Run held-out comparison", elem_id="compare-launch", scale=1)
        launched = gr.Markdown(elem_id="compare-launched")
    launched_job = gr.State(None)
    poll = gr.Timer(COMPARE_JOB_POLL_S, active=False)
    gr.Markdown("#### Token diff: one response scored under both versions")
    with gr.Row(equal_height=True):  # as tall as the id's box: no label above it
        sample = gr.Textbox(
            label="Sample id",
            show_label=False,
            placeholder="Sample id",
            container=False,
            elem_id="diff-sample",
            min_width=120,
        )
        score = gr.Button("Score under A and B", elem_id="diff-button", min_width=160)
    diff = gr.HTML(elem_id="token-diff")

    comparison = [metrics, rewards, lengths, side_by_side, sample]
    show = partial(compare_versions, services)
    tab.select(partial(_jobs, services), job, job, api_name="compare_jobs").then(
        partial(refresh_jobs, services), None, job_b, api_name="compare_jobs_b"
    )
    view = [job, version_a, version_b, job_b]
    for picker, name in ((job, "versions"), (job_b, "versions_b")):
        picker.change(
            partial(_versions, services), [job, job_b], [version_a, version_b, task], api_name=name
        ).then(show, view, comparison, api_name=f"compare_defaults{name.removeprefix('versions')}")
    run.click(show, view, comparison, api_name="compare")
    launch.click(
        partial(_launch, services),
        [job, version_a, version_b, task, num_prompts, seed, max_tokens, job_b],
        [launched, launched_job, poll],
        api_name="launch_compare",
    )
    poll.tick(
        partial(_follow, services, len(comparison)),
        [launched_job, *view],
        [launched, poll, *comparison],
        api_name="compare_job_status",
        show_progress="hidden",
    )
    score.click(
        partial(token_diff_view, services),
        [sample, version_a, version_b, job, job_b],
        diff,
        api_name="token_diff",
    )
