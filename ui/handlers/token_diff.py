"""Token-level diff: one stored response scored under two versions (on a worker), each token
coloured by the change in its log-prob from version A to version B."""

import math
from html import escape
from pathlib import Path

from db import InvalidValue
from ui.handlers.common import ask_worker, parse_id
from ui.handlers.compare_sides import side_names
from ui.render import BLOCK_STYLE, TOKEN_STYLE, visible
from ui.services import Services
from ui.tokens import token_texts

DELTA_SCALE = 2.0  # a change of this many nats (or more) gets the strongest colour


def delta_colour(delta: float) -> str:
    """White for no change, green when version B finds the token likelier, red when less."""
    strength = min(abs(delta) / DELTA_SCALE, 1.0)
    hue = 120 if delta > 0 else 0
    return f"hsl({hue}, 75%, {round(100 - 30 * strength)}%)"


def diff_html(
    token_ids: list[int],
    logprobs_a: list[float],
    logprobs_b: list[float],
    texts: list[str] | None,
    names: tuple[str, str],
) -> str:
    """The response with one ``<span class="diff-tok">`` per token (hover: both log-probs)."""
    spans = []
    for i, (token_id, a, b) in enumerate(zip(token_ids, logprobs_a, logprobs_b, strict=True)):
        delta = b - a
        title = (
            f"token id {token_id} · {names[0]} {a:.4f} · {names[1]} {b:.4f} · "
            f"Δ {delta:+.4f} (p {math.exp(a):.3f} → {math.exp(b):.3f})"
        )
        text = texts[i] if texts is not None else f"⟨{token_id}⟩"
        spans.append(
            f'<span class="diff-tok" data-delta="{delta:.6g}" '
            f'style="{TOKEN_STYLE};background:{delta_colour(delta)}" '
            f'title="{escape(title)}">{visible(text)}</span>'
        )
    total = sum(logprobs_b) - sum(logprobs_a)
    legend = (
        f'<div style="font-size:0.85em">Δ log-prob from {escape(names[0])} to '
        f'{escape(names[1])}: <span style="background:{delta_colour(-DELTA_SCALE)}">'
        f'−{DELTA_SCALE:g} or less</span> <span style="background:{delta_colour(0)}">0</span> '
        f'<span style="background:{delta_colour(DELTA_SCALE)}">+{DELTA_SCALE:g} or more</span>'
        f" · whole response Δ {total:+.4f} nats</div>"
    )
    return (
        f'<div class="token-diff">{legend}<div style="{BLOCK_STYLE}">{"".join(spans)}</div></div>'
    )


def token_diff_view(
    services: Services,
    sample_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    job_id: float | str | None = None,
    job_b: float | str | None = None,
) -> str:
    """A stored response scored under versions A and B of its job, coloured by the change;
    with ``job_b`` (another job than ``job_id``), version A is of ``job_id`` and version B of
    ``job_b`` (the worker checks that they share a tokenizer)."""
    chosen: list[int | None] = []
    jobs: list[int | None] = []

    def call() -> dict:
        chosen.extend(
            [
                parse_id(sample_id, "sample"),
                parse_id(version_a, "version A"),
                parse_id(version_b, "version B"),
            ]
        )
        if None in chosen:
            raise InvalidValue("choose a sample and two versions")
        jobs.extend([parse_id(job_id, "job"), parse_id(job_b, "job B")])
        if jobs[1] is None or jobs[1] == jobs[0]:
            return services.token_diff(*chosen)
        return services.token_diff(*chosen, *jobs)

    result, problem = ask_worker(call, "score")
    if problem is not None:
        return f"<p><b>{escape(problem)}</b></p>"
    texts = token_texts(result["token_ids"], [Path(result["checkpoint"])])
    other = jobs[0] if jobs[1] is None else jobs[1]
    names = tuple(side_names((jobs[0], chosen[1]), (other, chosen[2])).values())
    heading = f"<p>Sample #{chosen[0]} scored under {names[0]} and {names[1]}</p>"
    return heading + diff_html(
        result["token_ids"], result["logprobs_a"], result["logprobs_b"], texts, names
    )
