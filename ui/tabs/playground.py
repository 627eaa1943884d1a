"""Playground tab: pick a job's saved version and chat with it through our engine."""

from functools import partial

import gradio as gr

from ui.handlers.playground import answerable_versions, clear, send
from ui.services import Services
from ui.tabs.common import job_picker, refresh_jobs
from workers.api import max_tokens_bounds


def _versions(services: Services, job_id: int | None) -> tuple[dict, dict]:
    """The version picker for a job (the versions that can answer, the newest chosen) and
    the max tokens slider, fitted to the job's model."""
    versions = answerable_versions(services, job_id)
    info = "versions whose weights are on disk"
    if versions.not_kept:
        info += f" ({versions.not_kept} other version(s): weights not kept)"
    picker = gr.update(
        choices=versions.answerable,
        value=versions.answerable[-1] if versions.answerable else None,
        info=info,
    )
    default, largest = max_tokens_bounds(versions.context)
    limit = f"the model's context: {versions.context} tokens" if versions.context else None
    return picker, gr.update(value=default, maximum=largest, info=limit)


def build(services: Services, tab: gr.Tab) -> None:
    """The Playground tab's components and events (inside ``tab``)."""
    with gr.Row():
        job = job_picker(services, "playground-job")
        version = gr.Dropdown(
            [], allow_custom_value=True, label="Version", elem_id="playground-version"
        )
        temperature = gr.Number(0.0, label="Temperature", minimum=0, elem_id="playground-temp")
        default_tokens, most_tokens = max_tokens_bounds(None)
        max_tokens = gr.Slider(
            1, most_tokens, default_tokens, step=1, label="Max tokens", elem_id="playground-max"
        )
        seed = gr.Number(0, label="Seed", precision=0, elem_id="playground-seed")
    with gr.Row(equal_height=True):
        system = gr.Textbox(
            label="System prompt (optional)", lines=1, elem_id="playground-system", scale=4
        )
        keep_history = gr.Checkbox(
            False,
            label="Keep chat history",
            info="off: every message is a single turn; on: the chat so far is sent too "
            "(oldest turns left out past the model's context)",
            elem_id="playground-history",
            scale=1,
        )
    chat = gr.Chatbot([], label="Chat", latex_delimiters=[], elem_id="playground-chat")
    with gr.Row():
        message = gr.Textbox(label="Message", lines=2, scale=4, elem_id="playground-message")
        with gr.Column(scale=1):
            send_button = gr.Button("Send", variant="primary", elem_id="playground-send")
            clear_button = gr.Button("Clear", elem_id="playground-clear")
    facts = gr.Markdown(elem_id="playground-facts")
    tokens = gr.HTML(elem_id="playground-tokens")

    outputs = [chat, tokens, facts, message]
    tab.select(partial(refresh_jobs, services), None, job, api_name="playground_jobs")
    job.change(
        partial(_versions, services), job, [version, max_tokens], api_name="playground_versions"
    )
    inputs = [job, version, system, message, chat, temperature, max_tokens, seed, keep_history]
    send_button.click(partial(send, services), inputs, outputs, api_name="playground_send")
    message.submit(partial(send, services), inputs, outputs, api_name="playground_submit")
    clear_button.click(clear, None, outputs, api_name="playground_clear")
