"""Pieces several tabs share: the job picker, its refresh, and the id of a clicked table row."""

import gradio as gr

from ui.handlers.jobs import job_choices
from ui.services import Services


def first_cell(evt: gr.SelectData) -> int | None:
    """The first column (an id) of the table row the user clicked."""
    row = evt.row_value
    return int(row[0]) if row else None


def job_picker(services: Services, elem_id: str) -> gr.Dropdown:
    """A dropdown of the newest jobs, none chosen (choosing one fills what depends on it).
    It takes any job id too: API callers may name a job created after the page was built."""
    return gr.Dropdown(
        job_choices(services),
        value=None,
        allow_custom_value=True,
        label="Job",
        elem_id=elem_id,
        scale=2,
    )


def refresh_jobs(services: Services) -> dict:
    """The job picker with the current jobs (its value is left alone: the user may have
    picked one while this was on its way)."""
    return gr.update(choices=job_choices(services))
