"""Launch tab: model, task or JSONL data, reward, hyper-parameters, then Launch."""

from functools import partial

import gradio as gr

from ui.handlers.launch import (
    JSONL_SOURCE,
    KV_STRATEGIES,
    TASK_DEFAULT_REWARD,
    TASK_SOURCE,
    dataset_choices,
    launch_job,
    model_choices,
    reward_choices,
    task_choices,
    upload_dataset,
)
from ui.services import Services
from workers import api


def _show_source(source: str) -> tuple[dict, dict]:
    return gr.update(visible=source == TASK_SOURCE), gr.update(visible=source == JSONL_SOURCE)


def build(services: Services) -> None:
    """The Launch tab's components and events (inside a ``gr.Tab``)."""
    with gr.Row():
        with gr.Column(scale=3):
            model = gr.Dropdown(
                model_choices(services),
                value=api.DEMO_MODEL,
                allow_custom_value=True,  # API callers may name any checkpoint under a root
                label="Model",
                info="the built-in demo policy, or a checkpoint under RLWB_MODEL_ROOTS",
                elem_id="launch-model",
            )
            rescan = gr.Button("Rescan models and data", size="sm")
            source = gr.Radio([TASK_SOURCE, JSONL_SOURCE], value=TASK_SOURCE, label="Prompts from")
            with gr.Group(visible=True) as task_group:
                task = gr.Dropdown(
                    task_choices(), value="addition", label="Task", elem_id="launch-task"
                )
            with gr.Group(visible=False) as data_group:
                data = gr.Dropdown(
                    dataset_choices(services),
                    value=None,
                    allow_custom_value=True,
                    label="JSONL prompt set",
                    elem_id="launch-data",
                )
                upload = gr.File(label="or upload a JSONL file", file_types=[".jsonl"])
                upload_message = gr.Markdown()
            reward = gr.Dropdown(
                reward_choices(),
                value=TASK_DEFAULT_REWARD,
                allow_custom_value=True,
                label="Reward",
                info="exact_match, numeric_match, regex:<RE2 pattern> or a worker-registered name",
                elem_id="launch-reward",
            )
        with gr.Column(scale=2):
            with gr.Row():
                steps = gr.Number(50, label="Steps", precision=0, elem_id="launch-steps")
                batch_size = gr.Number(
                    16, label="Prompts per batch", precision=0, elem_id="launch-batch"
                )
                group_size = gr.Number(8, label="Group size", precision=0, elem_id="launch-group")
            with gr.Row():
                lr = gr.Number(3e-4, label="Learning rate", elem_id="launch-lr")
                temperature = gr.Number(1.0, label="Temperature")
                top_p = gr.Number(1.0, label="Top-p")
            with gr.Row():
                max_tokens = gr.Number(
                    16, label="Max tokens", precision=0, elem_id="launch-max-tokens"
                )
                max_policy_lag = gr.Number(0, label="Max policy lag", precision=0)
                kv_strategy = gr.Dropdown(list(KV_STRATEGIES), value="paged", label="KV cache")
            with gr.Accordion("More", open=False), gr.Row():
                clip_eps = gr.Number(0.2, label="Clip ε")
                kl_coef = gr.Number(0.0, label="KL coefficient")
                seed = gr.Number(0, label="Seed", precision=0)
                updates_per_batch = gr.Number(
                    1, label="Updates per batch (reuse within the lag)", precision=0
                )
            launch = gr.Button("Launch", variant="primary", elem_id="launch-button")
            status = gr.Markdown(elem_id="launch-status")

    form = {
        "model": model,
        "source": source,
        "task": task,
        "data": data,
        "reward": reward,
        "steps": steps,
        "batch_size": batch_size,
        "group_size": group_size,
        "lr": lr,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "max_policy_lag": max_policy_lag,
        "kv_strategy": kv_strategy,
        "clip_eps": clip_eps,
        "kl_coef": kl_coef,
        "seed": seed,
        "updates_per_batch": updates_per_batch,
    }
    launch.click(
        partial(launch_job, services), inputs_kwargs=form, outputs=status, api_name="launch"
    )
    source.change(_show_source, source, [task_group, data_group], api_name="launch_source")
    rescan.click(partial(_rescan, services), None, [model, data], api_name="launch_rescan")
    upload.upload(
        partial(_after_upload, services), upload, [data, upload_message], api_name="launch_upload"
    )


def _rescan(services: Services) -> tuple[dict, dict]:
    return gr.update(choices=model_choices(services)), gr.update(choices=dataset_choices(services))


def _after_upload(services: Services, file: str | None) -> tuple[dict, str]:
    choices, stored, message = upload_dataset(services, file)
    return gr.update(choices=choices, value=stored), message
