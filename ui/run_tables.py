"""The Runs view's tables: each run's final held-out score, speed and cost, and per point the
mean score over its seeds with a bootstrap interval."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from db import JobInfo, RunMetric
from ui.devices import devices_text, job_devices
from ui.run_stats import CONFIDENCE, SCORE_RESAMPLES, bootstrap_mean_ci

POINT_COLUMNS = [
    "point",
    "runs",
    "final held-out (mean)",
    "95% CI low",
    "95% CI high",
    "steps/min",
    "device·s",
    "tokens",
]
RUN_COLUMNS = [
    "job",
    "point",
    "seed",
    "final held-out",
    "at version",
    "steps/min",
    "devices",
    "device·s",
    "tokens",
    "status",
]


def steps_per_minute(metric: RunMetric | None) -> float | None:
    """Versions made per minute between the run's first and last version (``metric``: any
    metric read at every version, recorded or not)."""
    if metric is None or len(metric.versions) < 2 or metric.seconds[-1] <= 0:
        return None
    return (metric.versions[-1] - metric.versions[0]) / (metric.seconds[-1] / 60)


def device_seconds(job: JobInfo, now: datetime) -> float | None:
    """The seconds the job held its devices: its devices x its time from start to finish
    (to ``now`` while it runs)."""
    if job.started_at is None:
        return None
    end = job.finished_at or now
    return job_devices(job.config) * max((end - job.started_at).total_seconds(), 0.0)


def score_note(metric: str) -> str:
    return (
        f"Final held-out score: each run's `{metric}` at its highest version that has it. "
        f"CI: {CONFIDENCE:.0%} percentile bootstrap of the mean over the point's seeds "
        f"({SCORE_RESAMPLES:,} resamples; none with one seed)."
    )


@dataclass(frozen=True)
class RunFacts:
    """What the tables show about one run."""

    job: JobInfo
    point: str
    score: float | None
    score_version: int | None
    steps_per_min: float | None
    device_s: float | None
    tokens: int


def run_facts(
    grouped: Mapping[str, list[JobInfo]],
    finals: Mapping[int, tuple[int, float]],
    read: Mapping[int, RunMetric],
    tokens: Mapping[int, int],
    now: datetime,
) -> list[RunFacts]:
    """Each run's final held-out score (``finals``: job -> (version, score)), its speed (from
    a metric ``read`` at every version of the run) and cost (its devices' time, its
    ``tokens``)."""
    facts = []
    for point, jobs in grouped.items():
        for job in jobs:
            at, score = finals.get(job.id, (None, None))
            facts.append(
                RunFacts(
                    job,
                    point,
                    score,
                    at,
                    steps_per_minute(read.get(job.id)),
                    device_seconds(job, now),
                    tokens.get(job.id, 0),
                )
            )
    return facts


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _total(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def points_table(facts: list[RunFacts]) -> pd.DataFrame:
    """One row per point: its runs, the mean final held-out score over the runs that have one
    with its bootstrap interval, the mean steps/min, and the total cost of its runs."""
    rows = []
    for point in dict.fromkeys(f.point for f in facts):
        runs = [f for f in facts if f.point == point]
        scores = [f.score for f in runs if f.score is not None]
        interval = bootstrap_mean_ci(scores) or (None, None)
        rows.append(
            [
                point,
                len(runs),
                _mean(scores),
                *interval,
                _mean([f.steps_per_min for f in runs]),
                _total([f.device_s for f in runs]),
                sum(f.tokens for f in runs),
            ]
        )
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def runs_table(facts: list[RunFacts], default_device: str) -> pd.DataFrame:
    """One row per run."""
    rows = [
        [
            f.job.id,
            f.point,
            f.job.config.get("seed"),
            f.score,
            f.score_version,
            f.steps_per_min,
            devices_text(f.job.config, default_device),
            f.device_s,
            f.tokens,
            f.job.status.value,
        ]
        for f in facts
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)
