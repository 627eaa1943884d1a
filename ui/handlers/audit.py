"""Audit of one sample from the UI: a worker re-scores its response under the stamped
version's kept weights (`workers.scoring`); the verdict comes back as Markdown."""

from db import InvalidValue
from ui.handlers.common import ask_worker, parse_id
from ui.render import inert
from ui.services import Services


def verdict(result: dict) -> str:
    """One audit result as a sentence with a pass / fail / weights-not-kept verdict."""
    status = result["status"]
    where = f"sample #{result['sample_id']}"
    if "version" in result:
        where += f" (version {result['version']}, {result.get('tokens', 0)} tokens)"
    if status in ("pass", "fail"):
        relation = "≤" if status == "pass" else ">"
        return (
            f"**{status.upper()}** · {where}: max |stored − recomputed| log-prob "
            f"{result['max_abs_diff']:.3g} {relation} tolerance {result['tolerance']:g} "
            "(fp32, the stamped version's kept weights)"
        )
    problem = f": {inert(result['problem'])}" if result.get("problem") else ""
    return f"**{inert(status.upper())}** · {where}{problem}"


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
