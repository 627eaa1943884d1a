"""The Runs view's statistics against computations written here: the percentile bootstrap
(numpy's percentiles of means of a fixed-seed resample drawn in the test), its agreement with
the normal interval for many seeds, and TensorBoard's debiased EMA written as its formula."""

import math

import numpy as np
import pytest

from ui.run_stats import bootstrap_band, bootstrap_mean_ci, debiased_ema

SCORES = [0.61, 0.72, 0.55, 0.68, 0.70]


def _reference_ci(values, resamples, seed, confidence=0.95):
    """Means of resamples drawn with replacement by numpy's generator, and their percentiles."""
    data = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    means = np.array([data[row].mean() for row in draws])
    tail = 100 * (1 - confidence) / 2
    return tuple(np.percentile(means, [tail, 100 - tail]))


def test_the_interval_is_the_percentiles_of_resampled_means():
    expected = _reference_ci(SCORES, resamples=4000, seed=7)
    assert bootstrap_mean_ci(SCORES, resamples=4000, seed=7) == pytest.approx(expected, abs=1e-12)
    narrow = _reference_ci(SCORES, resamples=4000, seed=7, confidence=0.5)
    got = bootstrap_mean_ci(SCORES, confidence=0.5, resamples=4000, seed=7)
    assert got == pytest.approx(narrow, abs=1e-12)


def test_many_seeds_give_the_normal_interval_of_the_mean():
    values = np.random.default_rng(3).normal(0.5, 0.1, size=400)
    half = 1.959964 * values.std() / math.sqrt(len(values))
    low, high = bootstrap_mean_ci(values.tolist())
    assert low == pytest.approx(values.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(values.mean() + half, abs=0.1 * half)


def test_one_seed_has_no_interval():
    assert bootstrap_mean_ci([0.4]) is None
    assert bootstrap_mean_ci([]) is None


def test_the_band_is_each_columns_interval_with_whole_seeds_resampled():
    """[seeds, x] with a seed missing at some x: each column's mean over its known seeds, and
    the percentiles of the resampled means (the missing seed drawn counts for nothing)."""
    curves = np.array(
        [
            [0.1, 0.2, 0.3, np.nan],
            [0.2, 0.4, np.nan, np.nan],
            [0.3, 0.1, 0.5, 0.9],
            [0.0, 0.3, 0.6, np.nan],
        ]
    )
    mean, low, high = bootstrap_band(curves, resamples=3000, seed=11)
    draws = np.random.default_rng(11).integers(0, 4, size=(3000, 4))
    for column in range(4):
        values = curves[:, column]
        assert mean[column] == pytest.approx(np.nanmean(values))
        if np.count_nonzero(~np.isnan(values)) < 2:
            assert np.isnan(low[column]) and np.isnan(high[column])
            continue
        means = [np.nanmean(values[row]) for row in draws if not np.isnan(values[row]).all()]
        expected = np.percentile(means, [2.5, 97.5])
        assert (low[column], high[column]) == pytest.approx(tuple(expected), abs=1e-12)


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # a resample of missing seeds only
@pytest.mark.parametrize("seeds", [2, 3, 7])
def test_the_band_of_random_curves_is_numpys_percentiles_of_the_resampled_means(seeds):
    curves = np.random.default_rng(seeds).normal(0.5, 0.2, size=(seeds, 40))
    curves[0, ::5] = np.nan  # a seed missing at some versions
    mean, low, high = bootstrap_band(curves, resamples=500, seed=2)
    draws = np.random.default_rng(2).integers(0, seeds, size=(500, seeds))
    resampled = np.array([np.nanmean(curves[row], axis=0) for row in draws])  # [500, x]
    expected = np.nanpercentile(resampled, [2.5, 97.5], axis=0)
    spread = (~np.isnan(curves)).sum(axis=0) >= 2
    assert np.allclose(low[spread], expected[0][spread], rtol=0, atol=1e-12)
    assert np.allclose(high[spread], expected[1][spread], rtol=0, atol=1e-12)
    assert np.isnan(low[~spread]).all() and np.allclose(mean, np.nanmean(curves, axis=0))


def _tensorboard_ema(values, weight):
    """TensorBoard's smoothing as its source writes it: last = last * w + (1 - w) * y from
    last = 0; smoothed = last / (1 - w ** n), n the finite points so far."""
    out, last, n = [], 0.0, 0
    for y in values:
        if y is None or not math.isfinite(y):
            out.append(y)
            continue
        last = last * weight + (1 - weight) * y
        n += 1
        out.append(last / (1 - weight**n))
    return out


def test_the_ema_is_debiased_as_tensorboard_debiases_it():
    values = [1.0, 3.0, None, 2.0, float("nan"), 5.0, 4.0]
    got = debiased_ema(values, 0.6)
    expected = _tensorboard_ema(values, 0.6)
    for a, b in zip(got, expected, strict=True):
        assert (a is None and b is None) or a == pytest.approx(b, nan_ok=True)
    assert got[0] == 1.0  # starts on the data, not pulled towards 0


def test_the_ema_weights_the_values_seen_so_far_exponentially():
    """Closed form: the smoothed value at n is sum_i w^(n-i) (1-w) y_i / (1 - w^n)."""
    values, w = [2.0, -1.0, 4.0, 0.5], 0.9
    for n in range(1, len(values) + 1):
        weights = [(1 - w) * w ** (n - 1 - i) for i in range(n)]
        closed = sum(wi * y for wi, y in zip(weights, values, strict=False)) / (1 - w**n)
        assert debiased_ema(values, w)[n - 1] == pytest.approx(closed)


def test_no_smoothing_leaves_the_values_and_a_bad_weight_is_refused():
    assert debiased_ema([1.0, 2.0, None], 0) == [1.0, 2.0, None]
    with pytest.raises(ValueError, match="outside"):
        debiased_ema([1.0], 1.0)
