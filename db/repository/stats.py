"""Per-version sample totals (`VersionSampleStats`), updated with every stored batch."""

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.enums import FinishReason
from db.models import VersionSampleStats


def add_samples(
    session: Session, job_id: int, rows: Iterable[dict[str, Any]], sign: int = 1
) -> None:
    """Add sample rows (column values) to the job's totals (``sign`` -1: take deleted ones
    away). The caller holds the job's lock, so no concurrent writer updates the same totals."""
    totals: dict[tuple[int, FinishReason], VersionSampleStats] = {}
    for row in rows:
        key = (row["policy_version"], row["finish_reason"])
        if key not in totals:
            totals[key] = VersionSampleStats(
                job_id=job_id,
                policy_version=key[0],
                finish_reason=key[1],
                samples=0,
                rewarded=0,
                reward_sum=0.0,
                response_tokens=0,
            )
        total = totals[key]
        total.samples += sign
        total.response_tokens += sign * row["response_length"]
        if row["reward"] is not None:
            total.rewarded += sign
            total.reward_sum += sign * row["reward"]
    stored = session.scalars(
        select(VersionSampleStats).where(
            VersionSampleStats.job_id == job_id,
            VersionSampleStats.policy_version.in_({version for version, _ in totals}),
        )
    )
    existing = {(row.policy_version, row.finish_reason): row for row in stored}
    for key, total in totals.items():
        row = existing.get(key)
        if row is None:
            session.add(total)
            continue
        row.samples += total.samples
        row.rewarded += total.rewarded
        row.reward_sum += total.reward_sum
        row.response_tokens += total.response_tokens
