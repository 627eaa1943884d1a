"""Compare tab: pick a job and two versions; metrics, distributions, responses side by side."""

from functools import partial

import gradio as gr
import pandas as pd

from ui.handlers.compare import (
    METRIC_COLUMNS,
    compare_versions,
    launch_compare,
    version_choices,
)
from ui.services import Services
from ui.tabs.common import job_picker, refresh_jobs
from workers import api


def _versions(services: Services, job_id: int | None) -> tuple[dict, dict]:
    """Version pickers for a job: A is its first version, B its last."""
    versions = version_choices(services, job_id)
    first = versions[0] if versions else None
    last = versions[-1] if versions else None
    return gr.update(choices=versions, value=first), gr.update(choices=versions, value=last)


def build(services: Services, tab: gr.Tab) -> None:
    """The Compare tab's components and events (inside ``tab``)."""
    with gr.Row():
        job = job_picker(services, "compare-job")
        version_a = gr.Dropdown([], allow_custom_value=True, label="Version A", elem_id="compare-a")
        version_b = gr.Dropdown([], allow_custom_value=True, label="Version B", elem_id="compare-b")
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
    with gr.Accordion("Compare on held-out prompts (launches a compare job)", open=False):
        with gr.Row():
            task = gr.Dropdown(list(api.TASKS), value="addition", label="Task")
            num_prompts = gr.Number(64, label="Prompts", precision=0)
            seed = gr.Number(1, label="Held-out seed", precision=0)
            max_tokens = gr.Number(16, label="Max tokens", precision=0)
            launch = gr.Button("Launch compare job", elem_id="compare-launch")
        launched = gr.Markdown(elem_id="compare-launched")

    tab.select(partial(refresh_jobs, services), None, job, api_name="compare_jobs")
    job.change(partial(_versions, services), job, [version_a, version_b], api_name="versions")
    run.click(
        partial(compare_versions, services),
        [job, version_a, version_b],
        [metrics, rewards, lengths, side_by_side],
        api_name="compare",
    )
    launch.click(
        partial(launch_compare, services),
        [job, version_a, version_b, task, num_prompts, seed, max_tokens],
        launched,
        api_name="launch_compare",
    )
