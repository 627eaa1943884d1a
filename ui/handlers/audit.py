"""Audit of one sample from the UI: a worker re-scores its response under the kept weights
of the version(s) that sampled its tokens (`workers.scoring`); the verdict comes back as
Markdown, with one line per run of tokens of one version when there are several."""

from db import InvalidValue
from ui.handlers.common import ask_worker, parse_id
from ui.render import inert
from ui.services import Services


def segment_line(segment: dict) -> str:
    """One run of tokens of one version and how its re-scoring went."""
    line = (
        f"- tokens {segment['first_token']}-{segment['last_token']} · "
        f"version {segment['version']} · **{inert(segment['status'])}**"
    )
    if segment["max_abs_diff"] is not None:
        line += f" · max diff {segment['max_abs_diff']:.3g}"
    return line + (f" · {inert(segment['problem'])}" if segment.get("problem") else "")


def verdict(result: dict) -> str:
    """One audit result: a sentence with a pass / fail / weights-not-kept verdict, then, for
    a sample several versions sampled, one line per version's run and what was checked."""
    segments = result.get("segments", [])
    if len(segments) <= 1:
        return _sentence(result)
    lines = [segment_line(segment) for segment in segments]
    return "\n".join([_sentence(result), "", *lines, "", f"Checked: {inert(result['checks'])}"])


def _sentence(result: dict) -> str:
    status = result["status"]
    where = f"sample #{result['sample_id']}"
    if "version" in result:
        where += f" (version {result['version']}, {result.get('tokens', 0)} tokens)"
    if status in ("pass", "fail"):
        relation = "≤" if status == "pass" else ">"
        return (
            f"**{status.upper()}** · {where}: max |stored − recomputed| log-prob "
            f"{result['max_abs_diff']:.3g} {relation} tolerance {result['tolerance']:g} "
            f"(fp32, {_weights(result)})"
        )
    problem = f": {inert(result['problem'])}" if result.get("problem") else ""
    return f"**{inert(status.upper())}** · {where}{problem}"


def _weights(result: dict) -> str:
    several = len(result.get("segments", [])) > 1
    return (
        "each token's version's kept weights" if several else "the stamped version's kept weights"
    )


def audit_view(services: Services, sample_id: float | str | None) -> str:
    """Audit the chosen sample on a worker and say how it went."""
    try:
        chosen = parse_id(sample_id, "sample")
    except InvalidValue as exc:
        return f"**{inert(exc)}**"
    if chosen is None:
        return "Choose a sample to audit."
    answer, problem = ask_worker(lambda: services.audit([chosen]), "audit")
    if problem is not None:
        return f"**{inert(problem)}**"
    return verdict(answer["samples"][0])
