"""The lines `rlwb audit` prints: one per sample (and per version segment of an in-flight
sample), why fewer were audited than asked, then what could be checked."""

from collections import Counter
from typing import Any

MAX_LISTED_RANGES = 8  # of versions an audit could not check


def audit_line(result: dict[str, Any]) -> str:
    diff = result.get("max_abs_diff")
    shown = "-" if diff is None else f"{diff:.3g}"
    where = f"v{result['version']}" if "version" in result else "-"
    line = (
        f"sample {result['sample_id']:>8}  {where:<6} {result.get('tokens', 0):>5} tokens  "
        f"max |stored - recomputed| {shown:<9} {result['status']}"
    )
    line += f"  ({result['problem']})" if result.get("problem") else ""
    segments = result.get("segments") or []
    if len(segments) > 1:  # an in-flight sample: each version's tokens, and what was checked
        line += "".join(f"\n    {_segment_line(segment)}" for segment in segments)
        line += f"\n    checked: {result['checks']}"
    return line


def _segment_line(segment: dict[str, Any]) -> str:
    diff = segment.get("max_abs_diff")
    shown = "-" if diff is None else f"{diff:.3g}"
    tokens = f"tokens {segment['first_token']}-{segment['last_token']}"
    problem = f"  ({segment['problem']})" if segment.get("problem") else ""
    return f"{tokens:<14} v{segment['version']:<5} {shown:<9} {segment['status']}{problem}"


def _version_ranges(versions: list[int]) -> str:
    """Sorted versions as runs, e.g. ``0-24, 26-49, 51`` (the first `MAX_LISTED_RANGES`)."""
    runs: list[list[int]] = []
    for version in versions:
        if runs and version == runs[-1][1] + 1:
            runs[-1][1] = version
        else:
            runs.append([version, version])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:MAX_LISTED_RANGES]]
    more = len(runs) - len(shown)
    return ", ".join(shown) + (f" and {more} more ranges" if more else "")


def coverage_line(statuses: Counter[str], not_kept: dict[int, int]) -> str:
    """What the audit checked, and what it could not check and why: the audited samples'
    other statuses, and the samples of versions (``not_kept``: version -> samples) whose
    weights are gone."""
    checked = statuses["pass"] + statuses["fail"]
    reasons = [
        f"{count} {status}"
        for status, count in sorted(statuses.items())
        if status not in ("pass", "fail")
    ]
    unchecked = statuses.total() - checked + sum(not_kept.values())
    if not_kept:
        versions = _version_ranges(sorted(not_kept))
        reasons.insert(0, f"weights not kept for versions {versions}")
    line = f"{checked} checked ({statuses['pass']} pass, {statuses['fail']} fail), "
    return line + f"{unchecked} not checkable" + (": " + "; ".join(reasons) if reasons else "")


def shortfall_line(asked: int, audited: int, limit: int) -> str:
    """Why ``audited`` samples, fewer than the ``asked``: the most one audit checks
    (``limit``), or the kept versions hold no more with a response."""
    line = f"asked for {asked} samples, audited {audited}: "
    if audited == limit:
        return line + f"one audit checks at most {limit} (run it again for others)"
    return line + "the versions whose weights were kept hold no more samples with a response"
