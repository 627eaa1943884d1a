"""The Samples list's rows: one per sample, its prompt shown as the user's problem and its
version marked by whether its weights are kept (only those can be audited)."""

from collections.abc import Collection

import pandas as pd

from db import SampleSummary
from ui.render import fmt
from ui.services import Services
from workers.api import weights_kept

SNIPPET = 80
SAMPLE_COLUMNS = [
    "sample",
    "version",
    "weights",  # whether the version's weights are kept: only those can be audited
    "batch",
    "batch status",
    "prompt #",
    "group",
    "prompt",
    "response",
    "tokens",
    "finish",
    "error",
    "reward",
    "advantage",
]


def _snippet(text: str) -> str:
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"


def user_problem(sample: SampleSummary) -> str:
    """What the list shows as a sample's prompt: its last user turn (a system prompt, the same
    on every row, left out), else the rendered prompt."""
    users = [m["content"] for m in sample.prompt_messages or () if m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else sample.prompt_text


def samples_frame(
    items: list[SampleSummary], kept: Collection[tuple[int, int]] = ()
) -> pd.DataFrame:
    """The table's rows; ``kept``: the (job, version) pairs whose weights are kept."""
    rows = [
        [
            s.id,
            s.policy_version,
            "kept" if (s.job_id, s.policy_version) in kept else "not kept",
            s.batch_id,
            s.batch_status.value,
            s.prompt_index,
            s.group_index,
            _snippet(user_problem(s)),
            _snippet(s.response_text),
            s.response_length,
            s.finish_reason.value,
            s.error_code or "",
            fmt(s.reward),
            fmt(s.advantage),
        ]
        for s in items
    ]
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def kept_versions(services: Services, items: list[SampleSummary]) -> set[tuple[int, int]]:
    """The (job, version) pairs of the jobs of ``items`` whose weights are still on disk."""
    return {
        (job_id, info.version)
        for job_id in {s.job_id for s in items}
        for info in services.repository.list_versions(job_id)
        if weights_kept(info)
    }
