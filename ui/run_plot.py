"""The Runs view's curves drawn: an SVG for the page (each point's mean line and its band,
with a legend and the method written on it) and the same figure as a PNG file."""

import textwrap
from html import escape
from pathlib import Path

import numpy as np

from ui.runs import Curve

PALETTE = (
    "#4c78a8",
    "#f58518",
    "#54a24b",
    "#e45756",
    "#72b7b2",
    "#b279a2",
    "#eeca3b",
    "#9d755d",
    "#ff9da6",
    "#79706e",
)
WIDTH, HEIGHT = 900, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 44
TICKS = 5
BAND_OPACITY = 0.22
NOTE_WIDTH = 150  # characters per line of the PNG's method note


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _bounds(curves: list[Curve]) -> tuple[float, float, float, float]:
    """(x low, x high, y low, y high) over every mean and band, widened when flat."""
    xs = np.concatenate([c.x for c in curves])
    ys = np.concatenate([np.concatenate([c.mean, c.low, c.high]) for c in curves])
    x0, x1 = float(np.nanmin(xs)), float(np.nanmax(xs))
    y0, y1 = float(np.nanmin(ys)), float(np.nanmax(ys))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    return x0, x1, y0, y1


def _path(xs: list[float], ys: list[float]) -> str:
    return " ".join(
        f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}"
        for i, (x, y) in enumerate(zip(xs, ys, strict=True))
    )


def _runs_of(values: np.ndarray) -> list[slice]:
    """The stretches of finite values (a band or a line is not drawn across a gap)."""
    finite = np.isfinite(values)
    stretches, start = [], None
    for i, known in enumerate([*finite.tolist(), False]):
        if known and start is None:
            start = i
        elif not known and start is not None:
            stretches.append(slice(start, i))
            start = None
    return stretches


def curves_svg(curves: list[Curve], x_title: str, y_title: str, note: str) -> str:
    """The curves as an inline SVG (a ``path.run-band`` per band, a ``path.run-mean`` per
    mean line) with an HTML legend and the method note below it."""
    if not curves:
        return "<p>No selected run recorded this metric.</p>"
    x0, x1, y0, y1 = _bounds(curves)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(values: np.ndarray) -> list[float]:
        return (LEFT + (values - x0) / (x1 - x0) * plot_w).tolist()

    def sy(values: np.ndarray) -> list[float]:
        return (TOP + (y1 - values) / (y1 - y0) * plot_h).tolist()

    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="white" />']
    for i in range(TICKS):
        fx, fy = x0 + (x1 - x0) * i / (TICKS - 1), y0 + (y1 - y0) * i / (TICKS - 1)
        px, py = sx(np.array([fx]))[0], sy(np.array([fy]))[0]
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eee" />'
            f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" font-size="11">'
            f"{fy:.3g}</text>"
            f'<text x="{px:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" '
            f'font-size="11">{fx:.4g}</text>'
        )
    for index, curve in enumerate(curves):
        name = escape(curve.point)
        for part in _runs_of(curve.low):
            upper = _path(sx(curve.x[part]), sy(curve.high[part]))
            lower = _path(sx(curve.x[part][::-1]), sy(curve.low[part][::-1])).replace("M", "L", 1)
            parts.append(
                f'<path class="run-band" data-point="{name}" d="{upper} {lower} Z" '
                f'fill="{colour(index)}" fill-opacity="{BAND_OPACITY}" stroke="none" />'
            )
        for part in _runs_of(curve.mean):
            parts.append(
                f'<path class="run-mean" data-point="{name}" '
                f'd="{_path(sx(curve.x[part]), sy(curve.mean[part]))}" fill="none" '
                f'stroke="{colour(index)}" stroke-width="2" />'
            )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="12">'
        f"{escape(x_title)}</text>"
        f'<text x="14" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_title)}</text>'
    )
    svg = (
        f'<svg class="runs-plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
    )
    return svg + _legend(curves) + f'<p class="runs-method">{escape(note)}</p>'


def _legend(curves: list[Curve]) -> str:
    items = []
    for index, curve in enumerate(curves):
        seeds = f"{curve.seeds} seed{'s' if curve.seeds > 1 else ''}"
        band = " · mean with 95% band" if curve.seeds > 1 else ""
        items.append(
            f'<span class="runs-legend-item" style="margin-right:1.2em">'
            f'<span style="display:inline-block;width:1.4em;height:0.7em;'
            f'background:{colour(index)};margin-right:0.3em"></span>'
            f"{escape(curve.point)} ({seeds}{band})</span>"
        )
    return f'<div class="runs-legend">{"".join(items)}</div>'


def curves_png(curves: list[Curve], x_title: str, y_title: str, note: str, path: Path) -> Path:
    """The same figure as a PNG at ``path`` (matplotlib, imported here: the UI starts
    without it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(10, 5.2), dpi=120)
    try:
        for index, curve in enumerate(curves):
            seeds = f"{curve.seeds} seed{'s' if curve.seeds > 1 else ''}"
            axes.plot(
                curve.x, curve.mean, color=colour(index), lw=2, label=f"{curve.point} ({seeds})"
            )
            if not np.isnan(curve.low).all():
                axes.fill_between(
                    curve.x, curve.low, curve.high, color=colour(index), alpha=BAND_OPACITY, lw=0
                )
        axes.set_xlabel(x_title)
        axes.set_ylabel(y_title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="best")
        figure.text(0.01, 0.01, textwrap.fill(note, NOTE_WIDTH), fontsize=7, va="bottom")
        figure.subplots_adjust(bottom=0.22)
        figure.savefig(path)
    finally:
        pyplot.close(figure)
    return path
