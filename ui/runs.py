"""The Runs view's model, without Gradio: jobs grouped into points by their configs, and each
point's curve of a metric (mean over its seeds with a bootstrap band); its tables are in
`ui.run_tables`."""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from db import JobInfo, RunMetric
from ui.run_stats import (
    BAND_RESAMPLES,
    CONFIDENCE,
    bootstrap_band,
    debiased_ema,
)

# The x axes a curve may be drawn against, and their titles.
X_AXES = {
    "version": "policy version",
    "tokens": "response tokens sampled (cumulative)",
    "wall time": "seconds since the run's first version",
}
# Settings that tell runs of one point apart without making another point: each run's own.
RUN_KEYS = ("seed", "output_dir")
ALL_RUNS = "all runs"  # the one point of runs whose configs differ in their run keys only
CURVE_COLUMNS = ["series", "point", "job", "version", "x", "value", "ci_low", "ci_high"]


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as ``dotted.key -> JSON text`` (nested tables flattened), for comparing."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = json.dumps(value, sort_keys=True)
    return flat


@dataclass(frozen=True)
class ConfigSplit:
    """The settings every run shares, and each run's settings that not all runs share."""

    common: dict[str, str]
    differing: list[str]
    runs: dict[int, dict[str, str]]  # job -> its flat config

    def point_of(self, job_id: int) -> str:
        """A run's point: its differing settings other than `RUN_KEYS`, as ``key=value``."""
        config = self.runs[job_id]
        parts = [
            f"{key}={config.get(key, 'unset')}" for key in self.differing if key not in RUN_KEYS
        ]
        return ", ".join(parts) or ALL_RUNS


def split_configs(jobs: list[JobInfo]) -> ConfigSplit:
    """The common part of the jobs' configs and the keys whose values differ (or are unset in
    some), in the order they first appear."""
    runs = {job.id: flat_config(job.config) for job in jobs}
    keys = list(dict.fromkeys(key for config in runs.values() for key in config))
    common, differing = {}, []
    for key in keys:
        values = {config.get(key) for config in runs.values()}
        if len(values) == 1 and None not in values:
            common[key] = values.pop()
        else:
            differing.append(key)
    return ConfigSplit(common, differing, runs)


def points(jobs: list[JobInfo], split: ConfigSplit) -> dict[str, list[JobInfo]]:
    """The jobs of each point, points in the order of their first job."""
    grouped: dict[str, list[JobInfo]] = {}
    for job in jobs:
        grouped.setdefault(split.point_of(job.id), []).append(job)
    return grouped


@dataclass(frozen=True)
class Series:
    """One run's known values of a metric: their versions, x and (smoothed) values."""

    versions: np.ndarray
    x: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Curve:
    """One point's curve: the x and the mean over its seeds at each version, with the band
    (NaN where fewer than 2 seeds are known), and each seed's (smoothed) series."""

    point: str
    versions: np.ndarray
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int
    runs: dict[int, Series]  # by job


def run_series(metric: RunMetric, x_axis: str, tokens: Mapping[int, int], weight: float) -> Series:
    """The versions where the run recorded the metric, their x (the version, the run's
    response tokens up to it, or its seconds) and the values smoothed (`debiased_ema`)."""
    versions = np.asarray(metric.versions, dtype=np.int64)
    values = np.asarray(metric.values, dtype=np.float64)  # None: NaN
    known = ~np.isnan(values)
    if x_axis == "tokens":
        x = np.cumsum([tokens.get(v, 0) for v in metric.versions], dtype=np.float64)
        before = sum(count for v, count in tokens.items() if v < metric.versions[0])
        x += before  # tokens of versions sampled before the first recorded one
    elif x_axis == "wall time":
        x = np.asarray(metric.seconds, dtype=np.float64)
    else:
        x = versions.astype(np.float64)
    kept = values[known]
    smoothed = np.asarray(debiased_ema(kept.tolist(), weight), dtype=np.float64) if weight else kept
    return Series(versions[known], x[known], smoothed)


def point_curve(
    point: str,
    jobs: list[JobInfo],
    metrics: Mapping[int, RunMetric],
    tokens: Mapping[int, Mapping[int, int]],
    x_axis: str,
    weight: float,
) -> Curve | None:
    """The point's curve: its seeds aligned by version (x: their mean x at that version);
    None when none of its runs recorded the metric."""
    runs = {
        job.id: run_series(metrics[job.id], x_axis, tokens.get(job.id, {}), weight)
        for job in jobs
        if job.id in metrics
    }
    runs = {job: series for job, series in runs.items() if series.versions.size}
    if not runs:
        return None
    versions = np.unique(np.concatenate([series.versions for series in runs.values()]))
    values = np.full((len(runs), len(versions)), np.nan)
    xs = np.full_like(values, np.nan)
    for row, series in enumerate(runs.values()):
        columns = np.searchsorted(versions, series.versions)
        xs[row, columns], values[row, columns] = series.x, series.values
    mean, low, high = bootstrap_band(values)
    return Curve(point, versions, np.nanmean(xs, axis=0), mean, low, high, len(runs), runs)


def curves_frame(curves: list[Curve]) -> pd.DataFrame:
    """The curves as rows: each point's mean with its band, then each run's values."""
    frames = []
    for c in curves:
        band = ~np.isnan(c.low)
        frames.append(
            pd.DataFrame(
                {
                    "series": "mean",
                    "point": c.point,
                    "job": None,
                    "version": c.versions,
                    "x": c.x,
                    "value": c.mean,
                    "ci_low": np.where(band, c.low, np.nan),
                    "ci_high": np.where(band, c.high, np.nan),
                }
            )
        )
        for job, series in c.runs.items():
            frames.append(
                pd.DataFrame(
                    {
                        "series": "run",
                        "point": c.point,
                        "job": job,
                        "version": series.versions,
                        "x": series.x,
                        "value": series.values,
                    }
                )
            )
    if not frames:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    frame = pd.concat(frames, ignore_index=True).reindex(columns=CURVE_COLUMNS)
    return frame.astype({"job": "Int64"})  # blank on a mean's rows, a whole number on a run's


def method_note(weight: float) -> str:
    """How the curves were computed, in words (drawn on the plot and under it)."""
    smoothing = (
        f"EMA {weight:g} with bias correction (TensorBoard's debiasing), per run"
        if weight
        else "none"
    )
    return (
        f"Lines: mean over a point's seeds, aligned by version. Band: {CONFIDENCE:.0%} "
        f"percentile bootstrap of that mean over seeds ({BAND_RESAMPLES:,} resamples; shown "
        f"where 2 or more seeds are known). Smoothing: {smoothing}."
    )
