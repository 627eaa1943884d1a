"""Per-token training diagnostics of a trained sample: behaviour and trainer log-probs, the
importance ratio the loss used and whether PPO's clip was active on the token."""

import math
from dataclasses import dataclass
from html import escape

from db import SampleDetail
from ui.render import CELL_STYLE, fmt
from workers.api import TRAINER_DEFAULTS, clip_active

DEFAULT_CLIP_EPS = TRAINER_DEFAULTS["clip_eps"]  # when the job's config does not say
RATIO_FLAG = 0.1  # |log ratio| from which a token row is highlighted


@dataclass(frozen=True)
class TokenDiagnostics:
    index: int
    token_id: int
    behaviour: float  # the temperature-only log-prob the trainer's ratio divides by
    trainer: float
    ratio: float
    clipped: bool


def token_diagnostics(detail: SampleDetail, clip_eps: float) -> list[TokenDiagnostics]:
    """One row per response token of a trained sample (empty for an untrained one). The
    ratio is exp(trainer - behaviour) at the sample's first update, as the loss saw it when
    no truncated importance sampling was configured."""
    if detail.trainer_logprobs is None:
        return []
    behaviour = detail.temperature_logprobs or detail.behaviour_logprobs
    advantage = detail.advantage or 0.0
    rows = []
    for i, (token_id, old, new) in enumerate(
        zip(detail.response_token_ids, behaviour, detail.trainer_logprobs, strict=True)
    ):
        ratio = math.exp(min(new - old, 50.0))
        rows.append(
            TokenDiagnostics(i, token_id, old, new, ratio, clip_active(ratio, advantage, clip_eps))
        )
    return rows


def diagnostics_html(
    detail: SampleDetail, texts: list[str] | None, clip_eps: float = DEFAULT_CLIP_EPS
) -> str:
    """The per-token table (a note instead when the sample was not trained on)."""
    rows = token_diagnostics(detail, clip_eps)
    if not rows:
        return (
            '<p class="no-diagnostics">No training diagnostics: this sample was not trained '
            "on (rejected, zero-variance group, or stored before they were recorded).</p>"
        )
    head = "".join(
        f'<th style="{CELL_STYLE}">{name}</th>'
        for name in ("#", "token", "behaviour log-prob", "trainer log-prob", "ratio", "clipped")
    )
    body = []
    for row in rows:
        text = texts[row.index] if texts is not None else f"⟨{row.token_id}⟩"
        flagged = row.clipped or abs(math.log(row.ratio)) >= RATIO_FLAG
        style = "background:#fde2e2" if flagged else ""
        cells = (
            row.index,
            escape(text.replace("\n", "↵")),
            fmt(row.behaviour),
            fmt(row.trainer),
            fmt(row.ratio),
            "yes" if row.clipped else "no",
        )
        body.append(
            f'<tr class="diag" data-clipped="{str(row.clipped).lower()}" style="{style}">'
            + "".join(f'<td style="{CELL_STYLE}">{cell}</td>' for cell in cells)
            + "</tr>"
        )
    clipped = sum(row.clipped for row in rows)
    gap = max(abs(row.trainer - row.behaviour) for row in rows)
    summary = (
        f"<p><b>Training diagnostics</b> · clip ε {fmt(clip_eps)} · advantage "
        f"{fmt(detail.advantage)} · {clipped} of {len(rows)} tokens clipped · max |trainer − "
        f"behaviour| log-prob {fmt(gap)}</p>"
    )
    return (
        f'<div class="diagnostics">{summary}<table class="token-diagnostics">'
        f"<tr>{head}</tr>{''.join(body)}</table></div>"
    )
