"""Fields of the Launch tab built alike: numbers as text, the rewards of a weighted list."""

from typing import Any

import gradio as gr

from ui.handlers.reward_form import EXTRA_REWARDS
from workers import api


def number_field(value: float | None, label: str, **options: Any) -> gr.Textbox:
    """A number field as text, read whole by the handlers (`parse_number`): a browser's
    number box drops the characters it cannot read (``1e-3.5`` became ``1e-35``) and a
    rounded one rounds, both unseen."""
    return gr.Textbox("" if value is None else str(value), label=label, max_lines=1, **options)


def reward_fields() -> tuple[gr.components.Component, ...]:
    """The first reward's weight, each extra reward's name and weight, then the `length`
    threshold, the `overlong` cache and the reward model (`REWARD_FIELDS`)."""
    fields: list[gr.components.Component] = [
        number_field(1.0, label="Weight of the first reward", elem_id="launch-reward-weight")
    ]
    for n in range(2, EXTRA_REWARDS + 2):
        with gr.Row():
            fields.append(
                gr.Dropdown(
                    [("(none)", ""), *((name, name) for name in api.REWARDS)],
                    value="",
                    allow_custom_value=True,
                    label=f"Reward {n}",
                    elem_id=f"launch-reward-{n}",
                )
            )
            fields.append(number_field(1.0, label=f"Weight {n}", elem_id=f"launch-weight-{n}"))
    fields.append(
        number_field(
            None,
            label="Length threshold (tokens)",
            info="reward `length`: 0 up to it, falling to -1 at max tokens; blank: 3/4 of max "
            "tokens (0: a penalty from the first token)",
            elem_id="launch-length-threshold",
        )
    )
    fields.append(
        number_field(
            None,
            label="Overlong cache (tokens)",
            info="reward `overlong` (DAPO's): 0 up to max tokens minus it, falling to -1 at max "
            "tokens; blank: a fifth of max tokens",
            elem_id="launch-overlong-cache",
        )
    )
    fields.append(
        gr.Textbox(
            "",
            label="Reward model",
            info="reward `reward_model`: a sequence-classification checkpoint under "
            "RLWB_MODEL_ROOTS or a Hugging Face Hub id, scoring prompt + response",
            max_lines=1,
            elem_id="launch-reward-model",
        )
    )
    return tuple(fields)
