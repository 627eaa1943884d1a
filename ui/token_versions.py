"""HTML of the policy version of each response token: a sample whose tokens several versions
sampled (a weight update landed in flight) shows its runs, and on request its response is
coloured by version instead of by log-prob. Every stored string is escaped."""

from html import escape

from db import SampleDetail
from ui.render import TOKEN_STYLE, response_block, token_span

LOGPROB, VERSION = "log-prob", "version"
COLOUR_CHOICES = [LOGPROB, VERSION]
HUES = (210, 30, 120, 280, 0, 60, 180, 330)  # one per version of a sample, in order


def runs_text(runs: list[list[int]]) -> str:
    """``[[3, 12], [4, 4]]`` -> "tokens 0-11: v3, 12-15: v4"."""
    parts, first = [], 0
    for version, count in runs:
        parts.append(f"{first}-{first + count - 1}: v{version}")
        first += count
    return "tokens " + ", ".join(parts) if parts else "no tokens"


def version_colour(rank: int) -> str:
    """The background of the ``rank``-th version (oldest first) of a sample's tokens."""
    return f"hsl({HUES[rank % len(HUES)]}, 70%, 82%)"


def version_legend(runs: list[list[int]]) -> str:
    """A swatch per version of a sample's tokens, oldest first."""
    swatches = "".join(
        f'<span style="{TOKEN_STYLE};background:{version_colour(rank)}">v{version}</span> '
        for rank, (version, _) in enumerate(runs)
    )
    return f'<div class="version-legend" style="font-size:0.85em;margin:4px 0">{swatches}</div>'


def version_spans(
    detail: SampleDetail, texts: list[str] | None, start: int = 0, end: int | None = None
) -> str:
    """One ``<span class="tok">`` per response token from ``start`` to ``end`` (default: all),
    coloured by the version that sampled it (hover: token id, version, behaviour log-prob)."""
    ranked = [(r, v) for r, (v, count) in enumerate(detail.version_runs) for _ in range(count)]
    spans = []
    for i in range(start, len(ranked) if end is None else end):
        rank, version = ranked[i]
        token_id, logprob = detail.response_token_ids[i], detail.behaviour_logprobs[i]
        title = f"token id {token_id} · version {version} · log-prob {logprob:.4f}"
        text = texts[i] if texts is not None else None
        data = f'data-version="{version}"'
        spans.append(token_span(token_id, text, data, version_colour(rank), title))
    return "".join(spans)


def version_response(detail: SampleDetail, texts: list[str] | None) -> str:
    """The response's tokens coloured by version, with the versions' legend."""
    legend = version_legend(detail.version_runs)
    tokens = version_spans(detail, texts)
    return response_block("Response (policy version per token)", legend, tokens)


def versions_html(detail: SampleDetail, colour_by: str) -> str:
    """The runs of the sample's token versions: shown when several versions sampled it or
    its response is coloured by version."""
    runs = detail.version_runs
    if colour_by != VERSION and len(runs) <= 1:
        return ""
    return (
        f'<div class="token-versions"><h4>Policy version per token</h4>'
        f'<p class="version-runs">{escape(runs_text(runs))}</p></div>'
    )
