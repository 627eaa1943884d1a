"""The statistics of the Runs view, as pure functions: a percentile bootstrap of the mean over
seeds (a final score's interval, a curve's band) and TensorBoard's debiased EMA smoothing."""

import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
SCORE_RESAMPLES = 10_000  # a final score's interval: one number per point, afford many
BAND_RESAMPLES = 1_000  # a curve's band: every x of every point
BOOTSTRAP_SEED = 0  # the same selection always draws the same interval


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` rows of ``n`` indices drawn with replacement from 0..n-1."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_mean_ci(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = SCORE_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of ``values`` (e.g. the final scores of
    a point's seeds): the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` percentiles of
    the means of ``resamples`` resamples drawn with replacement. None for fewer than 2 values
    (one seed has no spread to resample)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return None
    means = data[_draws(data.size, resamples, seed)].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _order_statistics(
    values: np.ndarray, weights: np.ndarray, quantiles: list[float]
) -> list[np.ndarray]:
    """numpy's (linear) percentiles, per column, of the values each repeated ``weights``
    times (NaN values left out): ``values`` [distinct, x], ``weights`` [distinct]. The distinct
    values are sorted, not the repeated ones."""
    order = np.argsort(values, axis=0)  # NaN last
    ranked = np.take_along_axis(values, order, axis=0)
    counted = np.where(np.isnan(ranked), 0.0, weights[order])
    through = np.cumsum(counted, axis=0)  # repeated values up to and including each
    total = through[-1]
    columns = np.arange(values.shape[1])

    def nth(index: np.ndarray) -> np.ndarray:  # the index-th of the repeated, sorted values
        return ranked[(through <= index).sum(axis=0).clip(max=len(ranked) - 1), columns]

    found = []
    for quantile in quantiles:
        position = quantile / 100 * (total - 1)
        below = np.floor(position)
        a, b = nth(below), nth(np.minimum(below + 1, total - 1))
        found.append(np.where(total > 0, a + (b - a) * (position - below), np.nan))
    return found


def bootstrap_band(
    curves: np.ndarray,
    confidence: float = CONFIDENCE,
    resamples: int = BAND_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) at each column of ``curves`` ([seeds, x], NaN where a seed has no
    value): the mean of the known values and the percentile bootstrap interval of that mean,
    each resample drawing whole seeds (one draw of seeds shared by every column). Low and high
    are NaN where fewer than 2 seeds are known. A resample is how often it drew each seed, and
    a few seeds have few of those (3 seeds: 10), so each distinct one's means are computed once
    and weighted by how many resamples drew it."""
    data = np.asarray(curves, dtype=np.float64)
    known = ~np.isnan(data)
    counts = known.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, np.nansum(data, axis=0) / np.maximum(counts, 1), np.nan)
        low = np.full(data.shape[1], np.nan)
        high = np.full(data.shape[1], np.nan)
        spread = counts >= 2
        if data.shape[0] >= 2 and spread.any():
            drawn = _draws(data.shape[0], resamples, seed)
            times = (drawn[:, :, None] == np.arange(data.shape[0])).sum(axis=1)
            distinct, weights = np.unique(times, axis=0, return_counts=True)
            distinct = distinct.astype(np.float64)
            kept, present = np.where(known, data, 0.0)[:, spread], known[:, spread]
            drawn_counts = distinct @ present
            means = np.where(
                drawn_counts > 0, (distinct @ kept) / np.maximum(drawn_counts, 1), np.nan
            )
            tail = 100 * (1 - confidence) / 2
            low[spread], high[spread] = _order_statistics(means, weights, [tail, 100 - tail])
    return mean, low, high


def debiased_ema(values: Sequence[float | None], weight: float) -> list[float | None]:
    """TensorBoard's smoothing: an exponential moving average started at 0 and divided by
    ``1 - weight ** n`` (n: the finite values seen so far), so that it does not start near 0
    and lag the data. A missing or non-finite value stays as it is and does not move the
    average. ``weight`` 0 leaves the values unchanged."""
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight: {weight} is outside [0, 1)")
    smoothed: list[float | None] = []
    last, count = 0.0, 0
    for value in values:
        if value is None or not math.isfinite(value):
            smoothed.append(value)
            continue
        last = last * weight + (1 - weight) * value
        count += 1
        smoothed.append(last / (1 - weight**count))
    return smoothed
