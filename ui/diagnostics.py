"""Per-token training diagnostics of a trained sample: behaviour and trainer log-probs and what
the loss did to each token, as the trainer recorded it (`SampleRecord`'s loss record: the ratio
it used, the behaviour weight it applied, whether the token was trained, corrected, clipped).
Samples stored before that record get a recomputed view (the synchronous ratio and PPO's clip
rule)."""

import math
from dataclasses import dataclass
from html import escape

from db import LossFlag, SampleDetail
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
    clipped: bool  # never for a token not trained
    trained: bool
    corrected: bool | None = None  # None: recomputed (stored before the loss record)
    weight: float | None = None  # the behaviour weight applied; None: recomputed


def token_diagnostics(detail: SampleDetail, clip_eps: float) -> list[TokenDiagnostics]:
    """One row per response token of a trained sample (empty for an untrained one), from the
    stored loss record; without one (stored before it), recomputed: the ratio
    exp(trainer - behaviour) at the sample's first update and PPO's clip rule, as the loss saw
    them when no importance correction applied, on the tokens the policy sampled."""
    if detail.trainer_logprobs is None:
        return []
    behaviour = detail.temperature_logprobs or detail.behaviour_logprobs
    tokens = zip(detail.response_token_ids, behaviour, detail.trainer_logprobs, strict=True)
    if detail.loss_flags is not None:
        return [
            TokenDiagnostics(
                i,
                token_id,
                old,
                new,
                ratio,
                bool(flags & LossFlag.CLIPPED),
                bool(flags & LossFlag.TRAINED),
                bool(flags & LossFlag.CORRECTED),
                weight,
            )
            for i, ((token_id, old, new), ratio, weight, flags) in enumerate(
                zip(tokens, detail.loss_ratios, detail.loss_weights, detail.loss_flags, strict=True)
            )
        ]
    advantage = detail.advantage or 0.0
    rows = []
    for i, ((token_id, old, new), sampled) in enumerate(
        zip(tokens, detail.sampled_tokens, strict=True)
    ):
        ratio = math.exp(min(new - old, 50.0)) if sampled else 1.0
        clipped = sampled and clip_active(ratio, advantage, clip_eps)
        rows.append(TokenDiagnostics(i, token_id, old, new, ratio, clipped, sampled))
    return rows


def _state(row: TokenDiagnostics) -> str:
    if not row.trained:
        return "not trained"
    return "clipped" if row.clipped else "trained"


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
    names = ("#", "token", "behaviour log-prob", "trainer log-prob", "ratio", "weight")
    head = "".join(
        f'<th style="{CELL_STYLE}">{name}</th>' for name in (*names, "corrected", "loss")
    )
    body = []
    for row in rows:
        text = texts[row.index] if texts is not None else f"⟨{row.token_id}⟩"
        flagged = row.clipped or (row.trained and abs(math.log(row.ratio)) >= RATIO_FLAG)
        style = "background:#fde2e2" if flagged else ""
        cells = (
            row.index,
            escape(text.replace("\n", "↵")),
            fmt(row.behaviour),
            fmt(row.trainer),
            fmt(row.ratio),
            fmt(row.weight),
            "—" if row.corrected is None else ("yes" if row.corrected else "no"),
            _state(row),
        )
        body.append(
            f'<tr class="diag" data-clipped="{str(row.clipped).lower()}" '
            f'data-trained="{str(row.trained).lower()}" style="{style}">'
            + "".join(f'<td style="{CELL_STYLE}">{cell}</td>' for cell in cells)
            + "</tr>"
        )
    trained = [row for row in rows if row.trained]
    clipped = sum(row.clipped for row in trained)
    gap = max((abs(row.trainer - row.behaviour) for row in trained), default=0.0)
    source = (
        "as the loss recorded them"
        if detail.loss_flags is not None
        else "recomputed (stored before the loss's per-token record: the synchronous ratio "
        "and PPO's clip, no importance correction)"
    )
    summary = (
        f"<p><b>Training diagnostics</b> · {source} · clip ε {fmt(clip_eps)} · advantage "
        f"{fmt(detail.advantage)} · {clipped} of {len(trained)} trained tokens clipped "
        f"({len(rows) - len(trained)} not trained) · max |trainer − behaviour| log-prob over "
        f"trained tokens {fmt(gap)}</p>"
    )
    return (
        f'<div class="diagnostics">{summary}<table class="token-diagnostics">'
        f"<tr>{head}</tr>{''.join(body)}</table></div>"
    )
