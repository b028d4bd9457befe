"""Live charts of the scalars ranks log with ``jupyter_dist.log``: one bqplot figure per
metric, one line per rank, or for many ranks the mean with a min-max band.

bqplot sends arrays to the browser as binary buffers, so redrawing thousands of points a
few times a second stays cheap. bqplot is imported when the first point arrives.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any

import ipywidgets as widgets

#: more ranks than this: mean and min-max band instead of a line each
MANY_RANKS = 8
#: points per line sent to the browser; longer series are thinned evenly
MAX_POINTS = 4000
#: d3-format of tick labels: 4 significant digits, no trailing zeros (0.25, 1.2e-05, 200)
TICKS = ".4~g"
X_TICKS, Y_TICKS = 5, 4
COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


class MetricChart:
    """One metric's figure."""

    def __init__(self, name: str, ranks: list[int]) -> None:
        import bqplot

        self.name = name
        self.ranks = ranks
        # the scales' bounds are set from the data on every update: bqplot's own
        # domain is degenerate for a first single point (its tick format then fails in the
        # browser, "invalid format: .undefinedg", and the update is dropped) and padded to
        # odd ticks (-1, 49) after that
        self.x = bqplot.LinearScale(allow_padding=False)
        self.y = bqplot.LinearScale(allow_padding=False)
        # the title names the metric; ticks fall on round values (`round_ticks`)
        self.x_axis = bqplot.Axis(scale=self.x, side="bottom", label="step", tick_format=TICKS)
        self.y_axis = bqplot.Axis(scale=self.y, side="left", tick_format=TICKS)
        axes = [self.x_axis, self.y_axis]
        scales = {"x": self.x, "y": self.y}
        self.many = len(ranks) > MANY_RANKS
        if self.many:
            self.band = bqplot.Lines(
                x=[], y=[], scales=scales, fill="between", colors=[COLORS[0]],
                fill_opacities=[0.2], stroke_width=0,
            )  # fmt: skip
            self.mean = bqplot.Lines(x=[], y=[], scales=scales, colors=[COLORS[0]])
            marks = [self.band, self.mean]
            keys = [("mean", COLORS[0]), ("min-max", COLORS[0] + "55")]
        else:
            self.lines = {
                r: bqplot.Lines(x=[], y=[], scales=scales, colors=[_color(i)])
                for i, r in enumerate(ranks)
            }
            marks = list(self.lines.values())
            keys = [(f"rank {r}", _color(i)) for i, r in enumerate(ranks)]
        self.figure = bqplot.Figure(
            marks=marks,
            axes=axes,
            title=name,
            animation_duration=0,
            fig_margin={"top": 30, "bottom": 40, "left": 50, "right": 20},
            layout=widgets.Layout(width="440px", height="260px"),
        )
        self.figure.add_class("jd-metric-figure")
        self._ticks: tuple[list[float], list[float]] | None = None
        # the legend sits under the plot, never over the data
        self.legend = widgets.HTML(_legend(keys))
        self.legend.add_class("jd-metric-legend")
        self.box = widgets.VBox([self.figure, self.legend], layout=widgets.Layout(width="450px"))
        self.box.add_class("jd-metric")

    def update(self, series: dict[int, tuple[list[float], list[float]]]) -> None:
        import numpy as np

        if not self.many:
            arrays = {
                rank: _thin(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
                for rank, (xs, ys) in series.items()
            }
            with self.figure.hold_sync():
                self._bound([a[0] for a in arrays.values()], [a[1] for a in arrays.values()])
                for rank, line in self.lines.items():
                    x, y = arrays.get(rank, (np.zeros(0), np.zeros(0)))
                    with line.hold_sync():
                        line.x, line.y = x, y
            return
        by_step: dict[float, list[float]] = defaultdict(list)
        for xs, ys in series.values():
            for step, value in zip(xs, ys, strict=True):
                by_step[step].append(value)
        steps = np.asarray(sorted(by_step), dtype=float)
        values = [by_step[s] for s in sorted(by_step)]
        low = np.asarray([min(v) for v in values], dtype=float)
        high = np.asarray([max(v) for v in values], dtype=float)
        mean = np.asarray([sum(v) / len(v) for v in values], dtype=float)
        steps, low, high, mean = _thin_all(steps, low, high, mean)
        with self.figure.hold_sync():
            self._bound([steps], [low, high])
            with self.band.hold_sync():
                self.band.x, self.band.y = steps, np.vstack([low, high])
            with self.mean.hold_sync():
                self.mean.x, self.mean.y = steps, mean

    def _bound(self, xs: list[Any], ys: list[Any]) -> None:
        """Both scales span the data on round ticks; sent only when they moved."""
        ticks = chart_ticks(xs, ys)
        if ticks is None or ticks == self._ticks:
            return
        self._ticks = ticks
        for scale, axis, values in (
            (self.x, self.x_axis, ticks[0]),
            (self.y, self.y_axis, ticks[1]),
        ):
            with scale.hold_sync():
                scale.min, scale.max = values[0], values[-1]
            axis.tick_values = values


class MetricsView:
    """Every metric of one cell; once `build` made its box, `render` redraws what changed
    since the last call."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks
        self.box: widgets.HBox | None = None
        self.series: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
        self.charts: dict[str, MetricChart] = {}
        self._dirty: set[str] = set()

    def add(self, rank: int, points: tuple[tuple[str, float, float], ...]) -> None:
        for name, step, value in points:
            xs, ys = self.series.setdefault(name, {}).setdefault(rank, ([], []))
            xs.append(step)
            ys.append(value)
            self._dirty.add(name)

    def build(self) -> widgets.HBox:
        """The box of charts, drawn from every point so far at the next `render`."""
        self.box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.box.add_class("jd-metrics")
        self._dirty.update(self.series)
        return self.box

    def render(self) -> None:
        box = self.box
        if box is None or not self._dirty:
            return
        for name in sorted(self._dirty):
            chart = self.charts.get(name)
            if chart is None:
                chart = self.charts[name] = MetricChart(name, self.ranks)
                box.children = (*box.children, chart.box)
            chart.update(self.series[name])
        self._dirty.clear()

    def summary(self) -> list[str]:
        """``loss: 0.25 at step 99 (rank 0)`` per metric: the last value of the lowest rank."""
        lines = []
        for name, per_rank in sorted(self.series.items()):
            rank = min(per_rank)
            xs, ys = per_rank[rank]
            lines.append(f"{name}: {ys[-1]:.6g} at step {xs[-1]:g} (rank {rank})")
        return lines

    def state(self) -> dict[str, Any]:
        """Series lengths per metric and rank (for tests and status)."""
        return {n: {r: len(v[0]) for r, v in s.items()} for n, s in self.series.items()}


_ITEM_STYLE = (
    "display:inline-flex;align-items:center;gap:4px;margin-right:12px;font-size:11px;"
    "color:var(--jp-ui-font-color1,#222)"
)
_SWATCH_STYLE = "display:inline-block;width:16px;height:3px;border-radius:1px;"


def _color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def _legend(keys: list[tuple[str, str]]) -> str:
    """A one-line HTML legend: a coloured stroke and a label per line."""
    items = "".join(
        f'<span class="jd-legend-item" style="{_ITEM_STYLE}"><span class="jd-legend-swatch" '
        f'style="{_SWATCH_STYLE}background:{html.escape(color)}"></span>'
        f"{html.escape(label)}</span>"
        for label, color in keys
    )
    return f'<div class="jd-legend" style="margin:0 0 0 50px">{items}</div>'


def round_ticks(lo: float, hi: float, count: int) -> Any:
    """Round tick values covering ``lo``-``hi``: about ``count`` steps of 1, 2 or 5 times
    a power of ten, the first at or below ``lo`` and the last at or above ``hi``."""
    import numpy as np

    first, last, step = _nice(lo, hi, count)
    n = round((last - first) / step)
    return np.round(first + step * np.arange(n + 1), 12)


def _nice(lo: float, hi: float, ticks: int) -> tuple[float, float, float]:
    """``lo``-``hi`` widened to multiples of a round step (1, 2 or 5 times a power of ten)
    that cuts it into about ``ticks`` parts; and that step."""
    raw = (hi - lo) / max(ticks, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    error = raw / power  # as d3's tickIncrement chooses: the nearest of 1, 2, 5, 10
    factor = (
        10.0 if error >= 50**0.5 else 5.0 if error >= 10**0.5 else 2.0 if error >= 2**0.5 else 1.0
    )
    step = factor * power
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


def chart_ticks(xs: list[Any], ys: list[Any]) -> tuple[list[float], list[float]] | None:
    """Round x and y ticks spanning the data of ``xs`` and ``ys`` (sequences of values;
    non-finite ones ignored), never a zero-wide domain; None when there is no value. The
    first and last ticks are the scales' bounds, for the live chart and the snapshot."""
    x_lo, x_hi = _span(xs)
    y_lo, y_hi = _span(ys)
    if x_lo is None or y_lo is None or x_hi is None or y_hi is None:
        return None
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    if y_hi <= y_lo:
        pad = abs(y_hi) * 0.05 or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    x_ticks = [float(v) for v in round_ticks(x_lo, x_hi, X_TICKS)]
    return x_ticks, [float(v) for v in round_ticks(y_lo, y_hi, Y_TICKS)]


def _span(arrays: list[Any]) -> tuple[float | None, float | None]:
    """The finite min and max over ``arrays``, or (None, None) when there is no value."""
    import numpy as np

    values = [np.asarray(a, dtype=float) for a in arrays if len(a)]
    finite = [a[np.isfinite(a)] for a in values]
    finite = [a for a in finite if len(a)]
    if not finite:
        return None, None
    return float(min(a.min() for a in finite)), float(max(a.max() for a in finite))


def _thin(x: Any, y: Any) -> tuple[Any, Any]:
    if len(x) <= MAX_POINTS:
        return x, y
    step = -(-len(x) // MAX_POINTS)
    return x[::step], y[::step]


def _thin_all(*arrays: Any) -> tuple[Any, ...]:
    if len(arrays[0]) <= MAX_POINTS:
        return arrays
    step = -(-len(arrays[0]) // MAX_POINTS)
    return tuple(a[::step] for a in arrays)
