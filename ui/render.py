"""HTML for the sample view and the side-by-side comparison. Every stored string is escaped."""

import math
import re
from html import escape, unescape

import pandas as pd

from db import PromptComparison, SampleDetail, SampleSummary

LOGPROB_FLOOR = -6.0  # log-probs at or below this get the colour of the least likely token

TOKEN_STYLE = "border-radius:3px;padding:0 1px;margin:0 1px 0 0;color:#111"
BLOCK_STYLE = "white-space:pre-wrap;font-family:ui-monospace,monospace;line-height:1.9"
CELL_STYLE = "vertical-align:top;padding:4px 8px;border-bottom:1px solid #ddd"
BARE_CELL = "border:none;padding:2px 8px;white-space:nowrap"
SERIES_COLOURS = ("#4c78a8", "#f58518")  # version A, version B


# Markdown's marks, and ':' so that no URL is auto-linked (GFM links a bare "http://...")
_MARKS = r"\\`*_{}\[\]()#+\-.!|~>:"
_MARKDOWN = re.compile(f"([{_MARKS}])")
_ESCAPED_MARK = re.compile(f"\\\\([{_MARKS}])")


def inert(text: object) -> str:
    """Stored or user text made inert for a Markdown component: HTML escaped and every
    Markdown mark backslash-escaped, so no link, image or markup comes out of it."""
    return _MARKDOWN.sub(r"\\\1", escape(str(text), quote=False))


def from_inert(shown: str) -> str:
    """The text that `inert` made ``shown`` from (e.g. a chat turn read back from the
    component that displays it)."""
    return unescape(_ESCAPED_MARK.sub(r"\1", shown))


def fmt(value: float | int | None) -> str:
    """A number for display (4 significant digits); "—" for None."""
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def logprob_colour(logprob: float) -> str:
    """Red (unlikely) to green (certain) on a log scale down to `LOGPROB_FLOOR`."""
    scale = 1.0 - min(max(logprob, LOGPROB_FLOOR), 0.0) / LOGPROB_FLOOR
    return f"hsl({round(120 * scale)}, 75%, 80%)"


def visible(text: str) -> str:
    """Escaped token text, with empty tokens and line breaks made visible."""
    if text == "":
        return "∅"
    return escape(text).replace("\n", "↵\n")


def token_spans(
    token_ids: list[int],
    logprobs: list[float],
    texts: list[str] | None,
    temperature_logprobs: list[float] | None = None,
    label: str = "log-prob",
) -> str:
    """One ``<span class="tok">`` per response token, coloured by ``logprobs`` (named
    ``label`` on hover, with the token's id and its temperature-only log-prob if given).
    Without token texts the ids are shown."""
    spans = []
    for i, (token_id, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
        title = f"token id {token_id} · {label} {logprob:.4f} (p {math.exp(logprob):.3f})"
        if temperature_logprobs is not None:
            title += f" · temperature-only log-prob {temperature_logprobs[i]:.4f}"
        text = texts[i] if texts is not None else None
        data = f'data-logprob="{logprob:.6g}"'
        spans.append(token_span(token_id, text, data, logprob_colour(logprob), title))
    return "".join(spans)


def token_span(token_id: int, text: str | None, data: str, background: str, title: str) -> str:
    """One ``<span class="tok">``: the token's text (without one, its id), its ``data``
    attribute, background and hover ``title``."""
    shown = text if text is not None else f"⟨{token_id}⟩"
    return (
        f'<span class="tok" data-token-id="{token_id}" {data} '
        f'style="{TOKEN_STYLE};background:{background}" '
        f'title="{escape(title)}">{visible(shown)}</span>'
    )


def logprob_legend() -> str:
    """The log-prob colour scale, least likely to certain."""
    stops = ", ".join(logprob_colour(LOGPROB_FLOOR * (1 - k / 4)) for k in range(5))
    return (
        '<div class="tok-legend" style="font-size:0.85em;margin:4px 0">log-prob '
        f"{LOGPROB_FLOOR:g} or less "
        f'<span style="display:inline-block;width:120px;height:0.8em;'
        f'background:linear-gradient(to right, {stops})"></span> 0 (hover a token for its id)</div>'
    )


def _messages(detail: SampleDetail) -> str:
    messages = detail.prompt_messages or [{"role": "prompt", "content": detail.prompt_text}]
    rows = [
        f'<div class="msg"><b>{escape(str(m.get("role", "?")))}</b>'
        f'<div style="{BLOCK_STYLE}">{escape(str(m.get("content", "")))}</div></div>'
        for m in messages
    ]
    return "".join(rows)


def components_text(components: dict[str, float] | None, weights: dict[str, float]) -> str:
    """A sample's reward as its weighted components: "math 1 × 1 + format 0.2 × 0.2"."""
    terms = (
        f"{name} {fmt(score)} × {fmt(weights.get(name, 1.0))}" for name, score in components.items()
    )
    return " + ".join(terms) if components else "—"


def _facts(detail: SampleDetail, weights: dict[str, float] | None = None, devices: int = 1) -> str:
    sampled = [
        lp for lp, s in zip(detail.behaviour_logprobs, detail.sampled_tokens, strict=True) if s
    ]
    mean_logprob = sum(sampled) / len(sampled) if sampled else None  # an episode's turns only
    error = detail.error_code or "—"
    if detail.error_message:
        error += f": {detail.error_message}"
    facts = [
        ("sample", detail.id),
        ("job", detail.job_id),
        ("batch", f"{detail.batch_id} ({detail.batch_status.value})"),
        ("policy version", detail.policy_version),
        *([("rank", f"{fmt(detail.rank)} of {devices}")] if devices > 1 else []),
        ("prompt / group", f"{detail.prompt_index} / {detail.group_index}"),
        ("finish reason", detail.finish_reason.value),
        ("error", error),
        ("reward", fmt(detail.reward)),
        *(
            [("reward components", components_text(detail.reward_components, weights or {}))]
            if detail.reward_components
            else []
        ),
        ("advantage", fmt(detail.advantage)),
        ("response tokens", len(detail.response_token_ids)),
        ("mean log-prob", fmt(mean_logprob)),
        ("cached prompt tokens", detail.cached_prompt_tokens),
        ("seed", "—" if detail.seed is None else detail.seed),
        *(
            [
                ("episode finish", detail.episode_finish or "—"),
                ("turns", detail.turns),
                ("tool errors", detail.tool_errors),
            ]
            if detail.segments is not None
            else []
        ),
    ]
    cells = "".join(
        f'<tr><th style="{CELL_STYLE};text-align:left">{escape(name)}</th>'
        f'<td style="{CELL_STYLE}" data-fact="{escape(name)}">{escape(str(value))}</td></tr>'
        for name, value in facts
    )
    return f'<table class="facts">{cells}</table>'


def response_block(heading: str, legend: str, tokens: str) -> str:
    """A response's token spans under their heading and colour legend."""
    return (
        f"<h4>{heading}</h4>{legend}"
        f'<div class="tokens" style="{BLOCK_STYLE}">{tokens or "∅ (no tokens)"}</div>'
    )


def sample_html(
    detail: SampleDetail,
    texts: list[str] | None,
    weights: dict[str, float] | None = None,
    response: str | None = None,
    devices: int = 1,
) -> str:
    """The whole sample: facts (its reward components with the job's `weights`; the rank that
    generated it of a job on several ``devices``), prompt messages, reference, and the
    response: ``response`` (a `response_block`), else its tokens coloured by behaviour
    log-prob."""
    reference = detail.reference_output
    if response is None:
        tokens = token_spans(
            detail.response_token_ids,
            detail.behaviour_logprobs,
            texts,
            detail.temperature_logprobs,
        )
        response = response_block(
            "Response (behaviour log-prob per token)", logprob_legend(), tokens
        )
    return (
        f'<div class="sample-detail" data-sample-id="{detail.id}">'
        f"{_facts(detail, weights, devices)}"
        f"<h4>Prompt</h4>{_messages(detail)}"
        "<h4>Reference output</h4>"
        f'<div class="reference" style="{BLOCK_STYLE}">'
        f"{'—' if reference is None else escape(reference)}</div>"
        f"{response}"
        f'<details><summary>response text</summary><div style="{BLOCK_STYLE}">'
        f"{escape(detail.response_text)}</div></details></div>"
    )


def _answers(samples: list[SampleSummary]) -> str:
    items = []
    for s in samples:
        outcome = s.finish_reason.value + (f"/{s.error_code}" if s.error_code else "")
        items.append(
            f'<div class="answer" data-sample-id="{s.id}">'
            f"<small>#{s.id} · reward {fmt(s.reward)} · {escape(outcome)}</small>"
            f'<div style="{BLOCK_STYLE}">{escape(s.response_text) or "∅"}</div></div>'
        )
    return "".join(items)


def comparison_html(comparisons: list[PromptComparison], name_a: str, name_b: str) -> str:
    """The same prompts' responses under two versions (named ``name_a`` and ``name_b``: "version
    3", "job #4 version 200"), side by side."""
    if not comparisons:
        return "<p>No prompt was answered by both versions.</p>"
    head = (
        f'<tr><th style="{CELL_STYLE}">prompt</th><th style="{CELL_STYLE}">{escape(name_a)}'
        f'</th><th style="{CELL_STYLE}">{escape(name_b)}</th></tr>'
    )
    rows = "".join(
        f'<tr class="pair"><td style="{CELL_STYLE}"><small>#{c.prompt_index}</small>'
        f'<div style="{BLOCK_STYLE}">{escape(c.prompt_text)}</div></td>'
        f'<td style="{CELL_STYLE}">{_answers(c.samples_a)}</td>'
        f'<td style="{CELL_STYLE}">{_answers(c.samples_b)}</td></tr>'
        for c in comparisons
    )
    return f'<table class="side-by-side" style="width:100%">{head}{rows}</table>'


def histogram_html(frame: pd.DataFrame, title: str, names: dict[str, str]) -> str:
    """Bars per bin (rows of ``bin``, ``count``, ``version``) for two series, side by side;
    ``names`` labels the series (e.g. ``{"A": "version 3"}``)."""
    series = list(names)
    counts = {(row.bin, row.version): row.count for row in frame.itertuples()}
    bins = list(dict.fromkeys(frame["bin"]))
    top = max(frame["count"], default=0) or 1
    legend = " ".join(
        f'<span style="color:{colour}">■</span> {escape(names[name])}'
        for name, colour in zip(series, SERIES_COLOURS, strict=False)
    )
    rows = []
    for label in bins:
        bars = "".join(
            f'<div title="{escape(names[name])}: {counts.get((label, name), 0)}" '
            f'style="background:{colour};height:9px;margin:1px 0;'
            f'width:{100 * counts.get((label, name), 0) / top:.1f}%"></div>'
            for name, colour in zip(series, SERIES_COLOURS, strict=False)
        )
        numbers = " / ".join(str(counts.get((label, name), 0)) for name in series)
        rows.append(
            f'<tr><td style="{BARE_CELL}">{escape(str(label))}</td>'
            f'<td style="{BARE_CELL};width:100%">{bars}</td>'
            f'<td style="{BARE_CELL}">{numbers}</td></tr>'
        )
    return (
        f'<div class="histogram"><b>{escape(title)}</b> <small>{legend}</small>'
        f'<table style="width:100%;border-collapse:collapse">{"".join(rows)}</table></div>'
    )
