"""Queue tab: workers online, active and reserved jobs, and the equivalent Celery commands."""

from functools import partial

import gradio as gr

from ui.handlers.queue import queue_first_view, queue_view
from ui.services import Services


def build(services: Services, tab: gr.Tab) -> None:
    """The Queue tab's components and events (inside ``tab``). Opening it shows the
    database's side at once; asking the workers takes a broadcast round-trip (about a
    second), so it follows, and happens again on Refresh, never on a timer."""
    with gr.Row():
        summary = gr.Markdown(elem_id="queue-summary")
        refresh = gr.Button("Refresh", size="sm")
    workers = gr.Dataframe(label="Workers", interactive=False)
    active = gr.Dataframe(label="Active", interactive=False)
    reserved = gr.Dataframe(label="Reserved", interactive=False)
    commands = gr.Code(label="The same from the command line", language="shell")

    outputs = [summary, workers, active, reserved, commands]
    show = partial(queue_view, services)
    refresh.click(show, None, outputs, api_name="queue")
    tab.select(
        partial(queue_first_view, services), None, [summary, commands], api_name="queue_opened"
    ).then(show, None, outputs, api_name="queue_workers", show_progress="minimal")
