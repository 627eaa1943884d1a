"""HTML of a multi-turn episode (a sample with ``segments``) as a conversation after its opening
prompt: each assistant turn's tokens coloured by log-prob or by version, with its tool calls,
reward and tool error; each observation (a tool's result, the environment's feedback) a grey
block of the chat template's tokens, never trained. Every stored string is escaped."""

import json
from html import escape
from typing import Any

from db import SampleDetail
from ui.render import BLOCK_STYLE, fmt, logprob_legend, token_span, token_spans
from ui.token_versions import VERSION, version_legend, version_spans

OBSERVATION_LABELS = {"tool": "tool result", "user": "environment feedback"}
UNTRAINED = "#e2e2e2"  # the background of an observation's tokens
TURN_STYLE = "border-left:3px solid #4c78a8;padding:2px 8px;margin:6px 0"
OBSERVATION_STYLE = (
    "border-left:3px solid #999;background:#f3f3f3;color:#555;padding:2px 8px;margin:6px 0"
)
TOOL_CALL_STYLE = "font-family:ui-monospace,monospace;background:#eef3fb;padding:1px 4px"


def _shown(value: Any) -> str:
    """A stored value for display, escaped: a number as `fmt` shows it."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return escape(fmt(value) if number else str(value))


def _token_range(part: dict[str, Any]) -> str:
    start, end = part["start"], part["end"]
    return f"tokens {start}-{end - 1}" if end > start else "no tokens"


def _tool_call(call: dict[str, Any]) -> str:
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
    return (
        f'<div class="tool-call">→ call <code style="{TOOL_CALL_STYLE}">'
        f"{escape(str(call.get('name')))}({escape(arguments)})</code></div>"
    )


def _assistant(
    detail: SampleDetail, texts: list[str] | None, colour_by: str, part: dict, turn: int
) -> str:
    """One assistant turn: its sampled tokens, then its tool calls, reward and tool error."""
    start, end = part["start"], part["end"]
    if colour_by == VERSION:
        tokens = version_spans(detail, texts, start, end)
    else:
        temperature = detail.temperature_logprobs
        tokens = token_spans(
            detail.response_token_ids[start:end],
            detail.behaviour_logprobs[start:end],
            texts[start:end] if texts is not None else None,
            temperature[start:end] if temperature is not None else None,
        )
    facts = [f"<b>assistant · turn {turn}</b>", _token_range(part)]
    if part.get("cached"):
        facts.append(f"{_shown(part['cached'])} prompt tokens cached")
    if part.get("reward") is not None:
        facts.append(f'<span class="turn-reward">reward {_shown(part["reward"])}</span>')
    calls = "".join(_tool_call(call) for call in part.get("tool_calls") or [])
    error = ""
    if part.get("tool_error"):
        error = (
            '<div class="tool-error" style="color:#a40000">tool call not parsed: '
            f"{_shown(part['tool_error'])}</div>"
        )
    return (
        f'<div class="turn" data-turn="{turn}" style="{TURN_STYLE}"><small>'
        f"{' · '.join(facts)}</small>"
        f'<div class="tokens" style="{BLOCK_STYLE}">{tokens or "∅ (no tokens)"}</div>'
        f"{calls}{error}</div>"
    )


def _observation(detail: SampleDetail, texts: list[str] | None, part: dict) -> str:
    """An observation: its text, and the template's tokens that carry it (greyed)."""
    role = str(part["role"])
    label = OBSERVATION_LABELS.get(role, f"{role} message")
    facts = [f"<b>{escape(label)} (not trained)</b>", _token_range(part)]
    if part.get("tool_error"):
        facts.append("after a tool call that could not be parsed")
    spans = "".join(
        token_span(
            detail.response_token_ids[i],
            texts[i] if texts is not None else None,
            'data-trained="false"',
            UNTRAINED,
            f"token id {detail.response_token_ids[i]} · the chat template's, not trained",
        )
        for i in range(part["start"], part["end"])
    )
    count = part["end"] - part["start"]
    return (
        f'<div class="observation" data-role="{escape(role)}" style="{OBSERVATION_STYLE}">'
        f"<small>{' · '.join(facts)}</small>"
        f'<div class="observation-text" style="{BLOCK_STYLE}">'
        f"{escape(str(part.get('text', ''))) or '∅'}</div>"
        f"<details><summary>its {count} template tokens</summary>"
        f'<div class="tokens" style="{BLOCK_STYLE}">{spans}</div></details></div>'
    )


def episode_html(detail: SampleDetail, texts: list[str] | None, colour_by: str) -> str:
    """The episode's segments in order, under a heading and the colour legend of its assistant
    tokens (by log-prob, or by version when ``colour_by`` is `VERSION`)."""
    if colour_by == VERSION:
        how, legend = "policy version", version_legend(detail.version_runs)
    else:
        how, legend = "behaviour log-prob", logprob_legend()
    parts, turn = [], 0
    for part in detail.segments or []:
        if part["role"] == "assistant":
            turn += 1
            parts.append(_assistant(detail, texts, colour_by, part, turn))
        else:
            parts.append(_observation(detail, texts, part))
    heading = (
        f"Episode after the prompt ({how} per assistant token; grey: the chat template's "
        "tokens, never trained)"
    )
    return f'<h4>{heading}</h4>{legend}<div class="episode">{"".join(parts)}</div>'
