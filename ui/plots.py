"""The Jobs page's plots over versions: which series each plot shows, EMA smoothing drawn over
the faint raw series, and whether a plot has anything to draw."""

import math
from dataclasses import dataclass

import pandas as pd

SERIES_COLUMNS = ["version", "value", "series"]
EMA_WEIGHT = 0.8  # TensorBoard-style smoothing: each point keeps this share of the previous
RAW, SMOOTHED = "raw", "EMA"
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756")
FAINT = ("#c4d3e5", "#fbd1a9", "#c0dcba", "#f4bcbd")
Y_FORMAT = ".3~g"  # the 4 significant digits of `ui.render.fmt`, on the axes too
X_FORMAT = "d"  # versions are whole numbers


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    y_title: str
    series: tuple[str, ...]
    smooth: bool = True
    sparse: bool = False  # measured on some versions only: drawn through the known points
    optional: bool = False  # only some jobs have it: hidden, not "no data yet", without data
    y_format: str = Y_FORMAT  # d3's format of the y axis' ticks

    def names(self) -> list[str]:
        """The series as drawn: raw and EMA of each smoothed series, else the series."""
        if not self.smooth:
            return list(self.series)
        return [f"{name} ({kind})" for name in self.series for kind in (RAW, SMOOTHED)]

    def colours(self) -> dict[str, str]:
        """Each smoothed series: the faint colour raw, the full colour for its EMA."""
        if not self.smooth:
            return dict(zip(self.series, PALETTE, strict=False))
        return {
            f"{name} ({kind})": colour
            for name, faint, full in zip(self.series, FAINT, PALETTE, strict=False)
            for kind, colour in ((RAW, faint), (SMOOTHED, full))
        }


PLOTS = (
    PlotSpec("reward", "Reward (trained batch)", "reward", ("reward mean",)),
    PlotSpec(
        "heldout",
        "Held-out score (greedy pass@1; mean@k sampled when set)",
        "score",
        ("held-out accuracy", "held-out mean@k"),
        smooth=False,
        sparse=True,
    ),
    PlotSpec("length", "Response length", "tokens", ("mean response tokens",)),
    PlotSpec("kl", "KL to the reference", "KL", ("KL",)),
    PlotSpec(
        "mismatch",
        "Train/infer log-prob mismatch",
        "max |Δ log-prob|",
        ("mismatch",),
        y_format=".1e",  # values near 1e-6: ".3~g" would read 0.000002
    ),
    PlotSpec("batches", "Rollout batches", "batches", ("accepted", "rejected"), smooth=False),
    # a series per reward of the job's list, found in its metrics (`with_components`); a job
    # of one reward has none: the plot is hidden, not "no data yet"
    PlotSpec(
        "reward-components",
        "Reward components",
        "mean score",
        (),
        smooth=False,
        sparse=True,
        optional=True,
    ),
    # a pipelined job's (or one trained on lagged samples): `EXTRA_METRICS`
    PlotSpec(
        "policy-lag",
        "Policy lag of the trained tokens",
        "versions behind",
        ("lag mean", "lag max"),
        smooth=False,
        optional=True,
    ),
    PlotSpec(
        "importance",
        "Importance weights of off-policy tokens (before truncation)",
        "weight; fraction",
        ("IS weight mean", "IS weight max", "truncated fraction"),
        smooth=False,
        optional=True,
    ),
    PlotSpec(
        "pipeline-time",
        "Trainer time per version",
        "seconds",
        ("generate", "train", "wait"),
        smooth=False,
        optional=True,
    ),
    # a job with an environment (multi-turn episodes): `EXTRA_METRICS`
    PlotSpec(
        "episodes",
        "Episodes: turns, tool calls and tool-call errors",
        "per episode; per turn; rate",
        ("turns per episode", "tool calls per turn", "tool-error rate"),
        smooth=False,
        optional=True,
    ),
)
COMPONENT_PREFIX, COMPONENT_SUFFIX = "reward/", "/mean"
# The series of the pipeline and episode plots: the trainer's metric (in a version's extra)
# of each
EXTRA_METRICS = {
    "lag mean": "policy_lag_mean",
    "lag max": "policy_lag_max",
    "IS weight mean": "is_weight_mean",
    "IS weight max": "is_weight_max",
    "truncated fraction": "is_truncated_fraction",
    "generate": "generate_s",
    "train": "train_s",
    "wait": "wait_s",
    "turns per episode": "turns_per_episode",
    "tool calls per turn": "tool_calls_per_turn",
    "tool-error rate": "tool_error_rate",
}


def extra_values(extra: dict[str, float]) -> dict[str, float | None]:
    """A version's pipeline and episode series (`EXTRA_METRICS`) from its metrics' extra."""
    return {name: extra.get(key) for name, key in EXTRA_METRICS.items()}


def components(extra: dict[str, float]) -> dict[str, float]:
    """A version's reward components' means (by reward name) from its metrics' extra."""
    return {
        key.removeprefix(COMPONENT_PREFIX).removesuffix(COMPONENT_SUFFIX): value
        for key, value in extra.items()
        if key.startswith(COMPONENT_PREFIX) and key.endswith(COMPONENT_SUFFIX)
    }


def with_components(spec: PlotSpec, names: list[str]) -> PlotSpec:
    """The reward components' plot drawing these components (any other plot unchanged)."""
    return (
        PlotSpec(**{**vars(spec), "series": tuple(names)})
        if spec.key == "reward-components"
        else spec
    )


def ema(values: list[float | None], weight: float = EMA_WEIGHT) -> list[float | None]:
    """Exponential moving average over the known values (unknown ones stay unknown and
    do not move the average)."""
    out: list[float | None] = []
    last = None
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(None)
            continue
        last = value if last is None else weight * last + (1 - weight) * value
        out.append(last)
    return out


def plot_frame(spec: PlotSpec, values: dict[int, dict[str, float | int | None]]) -> pd.DataFrame:
    """Long-format rows (version, value, series) of one plot. Every drawn series has a row
    per version, None where unknown (a plot keeps its colours from one update to the next
    only if its series never change), except a sparse plot's: a line joins its known points."""
    versions = sorted(values)
    rows = []
    for name in spec.series:
        raw = [values[v].get(name) for v in versions]
        if not spec.smooth:
            known = (not spec.sparse or x is not None for x in raw)
            rows += [(v, x, name) for v, x, k in zip(versions, raw, known, strict=True) if k]
            continue
        smoothed = ema(raw)
        rows += [(v, x, f"{name} ({RAW})") for v, x in zip(versions, raw, strict=True)]
        rows += [(v, x, f"{name} ({SMOOTHED})") for v, x in zip(versions, smoothed, strict=True)]
    return pd.DataFrame(rows, columns=SERIES_COLUMNS)


def has_data(frame: pd.DataFrame) -> bool:
    """Whether a plot's frame has at least one known value to draw."""
    return bool(frame["value"].notna().any())


def shown(spec: PlotSpec, frame: pd.DataFrame, hidden: set[str]) -> tuple[bool, bool]:
    """(the plot, its "no data yet" note): whether each is shown; neither for a hidden plot,
    nor the note of an optional one."""
    drawn = has_data(frame) and spec.key not in hidden
    return drawn, not drawn and spec.key not in hidden and not spec.optional
