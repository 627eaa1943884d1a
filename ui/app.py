"""The Gradio app: `build_app(services)` (no server) and `launch(...)`."""

import gradio as gr

from ui.handlers.launch import MAX_UPLOAD_BYTES
from ui.services import Services, default_services
from ui.tabs import compare, jobs, playground, queue, runs, samples
from ui.tabs import launch as launch_tab
from workers import api

TITLE = "RL Workbench"


def build_app(services: Services) -> gr.Blocks:
    """The whole UI over ``services``, one tab per task; every event has an ``api_name``."""
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"## {TITLE}")
        with gr.Tabs() as tabs:
            with gr.Tab("Launch", id="launch"):
                form = launch_tab.build(services)
            with gr.Tab("Jobs", id="jobs"):
                jobs.build(services, form, tabs)
            with gr.Tab("Samples", id="samples") as samples_tab:
                samples.build(services, samples_tab)
            with gr.Tab("Compare", id="compare") as compare_tab:
                compare.build(services, compare_tab)
            with gr.Tab("Runs", id="runs") as runs_tab:
                runs.build(services, runs_tab)
            with gr.Tab("Playground", id="playground") as playground_tab:
                playground.build(services, playground_tab)
            with gr.Tab("Queue", id="queue") as queue_tab:
                queue.build(services, queue_tab)
    return demo


def launch(
    host: str = "127.0.0.1",
    port: int = 7860,
    auth: tuple[str, str] | None = None,
    services: Services | None = None,
    share: bool = False,
    allow_unauthenticated: bool = False,
) -> None:
    """Serve the UI (blocking). Binds to localhost unless ``host`` says otherwise; a
    public share link only with ``share``; ``auth`` is a (user, password), required for a
    non-loopback ``host`` or a share link (`ValueError` otherwise)."""
    problem = api.exposure_problem(host, auth, share, allow_unauthenticated)
    if problem:
        raise ValueError(problem)
    demo = build_app(services or default_services())
    demo.queue(default_concurrency_limit=4).launch(
        server_name=host, server_port=port, auth=auth, share=share, max_file_size=MAX_UPLOAD_BYTES
    )
