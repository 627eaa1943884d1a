"""Launch's Model field: the choices (the shipped policies, then the checkpoints under the
model roots) and the preset a shipped policy fills in when the user chooses it."""

from typing import Any

from ui.files import find_checkpoints
from ui.handlers.launch import SINGLE_TURN, TASK_SOURCE
from ui.handlers.reward_form import REWARD_FIELDS, reward_form
from ui.services import Services
from workers import api

SHIPPED_CHOICES = [
    ("built-in demo policy", api.DEMO_MODEL),
    ("built-in calculator policy: word problems with a tool", api.CALCULATOR_MODEL),
    ("R1 recipe (math + format): word problems in <think>/<answer>", api.R1_MODEL),
]
# The fields a shipped policy's preset sets when it is chosen (`preset_values`).
PRESET_FIELDS = ("source", "task", "environment", "steps", "max_tokens", "max_turns")
PRESET_FIELDS += ("max_episode_tokens", "reward", *REWARD_FIELDS)


def model_choices(services: Services) -> list[tuple[str, str]]:
    """(label, value): the shipped policies, then every checkpoint found under the model
    roots."""
    found = [(str(path), str(path)) for path in find_checkpoints(services.model_roots)]
    return [*SHIPPED_CHOICES, *found]


def preset_values(model: str | None) -> dict[str, Any] | None:
    """The `PRESET_FIELDS` as the form shows them for a shipped policy (`api.MODEL_PRESETS`:
    its task, its environment or single-turn, its rewards (the task's by default), its
    lengths); None for any other model, whose form is left as the user set it."""
    preset = api.MODEL_PRESETS.get(model or "")
    if preset is None:
        return None
    values = {**api.TRAINER_DEFAULTS, **preset, "source": TASK_SOURCE}
    values |= reward_form(values["reward"])
    values["environment"] = values["environment"] or SINGLE_TURN
    return {name: values[name] for name in PRESET_FIELDS}
