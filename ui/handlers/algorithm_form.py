"""The Launch form's algorithm: a published variant's preset (`PRESETS`) fills the form's
fields it sets and names its paper; the job carries the preset's name, so the settings the form
has no field for come with it (`GRPOConfig.from_dict`)."""

from typing import Any

from ui.handlers.launch import FORM_FIELDS
from workers import api

PRESETS = api.algorithms.ALGORITHM_PRESETS
CUSTOM_ALGORITHM = ""  # no preset: the fields as set
ALGORITHM_CHOICES = [
    ("custom: the fields as set", CUSTOM_ALGORITHM),
    *((f"{name}: {preset.summary}", name) for name, preset in PRESETS.items()),
]
# the form's fields some preset sets, in the form's order
ALGORITHM_FIELDS = tuple(
    name for name in FORM_FIELDS if any(name in preset.settings for preset in PRESETS.values())
)


def algorithm_form(name: str | None) -> tuple[dict[str, Any], str]:
    """(the `ALGORITHM_FIELDS` preset ``name`` sets -> their values, a Markdown line with its
    paper and every setting it brings); nothing for the custom choice or an unknown name."""
    preset = PRESETS.get(name or CUSTOM_ALGORITHM)
    if preset is None:  # custom, or a name Launch refuses with the job's reason
        return {}, ""
    values = {key: preset.settings[key] for key in ALGORITHM_FIELDS if key in preset.settings}
    settings = ", ".join(f"`{key} = {value}`" for key, value in preset.settings.items())
    if preset.overlong:
        settings += ", and the `overlong` reward added (its cache a fifth of max tokens)"
    line = f"**{name}** ([{preset.paper}]({preset.url})): {preset.summary}. Sets {settings}."
    return values, line
