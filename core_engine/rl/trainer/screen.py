"""Which groups of a rollout may be trained on, and why the others may not."""

from __future__ import annotations

from dataclasses import dataclass

from core_engine.rl.rollout import RawRollout


@dataclass(frozen=True)
class Screened:
    rejected: dict[int, str]  # group -> why it may not be trained on
    rejected_all: bool  # nothing of the batch may be trained on
    reasons: list[str]  # the problems found, one per faulty group


def screen_groups(rollout: RawRollout, reject_scope: str) -> Screened:
    """A group with an errored, aborted or empty sample is never trained on; with
    `reject_scope="batch"` such a group rejects the whole batch."""
    rejected: dict[int, str] = {}
    for i, (reason, error, ids) in enumerate(
        zip(rollout.finish_reasons, rollout.errors, rollout.response_ids, strict=True)
    ):
        problem = None
        if reason in ("error", "abort"):
            problem = f"sample {i}: {reason}/{error.code.value}: {error.message}"
        elif not ids:
            problem = f"sample {i}: empty response"
        if problem:
            rejected.setdefault(rollout.group_of(i), problem)
    groups = len(rollout.prompt_ids)
    reasons = list(rejected.values())
    rejected_all = bool(rejected) and (reject_scope == "batch" or len(rejected) == groups)
    if rejected_all:
        rejected = {g: rejected.get(g, "rejected with its batch") for g in range(groups)}
    return Screened(rejected, rejected_all, reasons)
