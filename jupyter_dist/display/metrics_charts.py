"""Live charts of the scalars ranks log with ``jupyter_dist.log``: one bqplot figure per
metric, one line per rank, or for many ranks the mean with a min-max band.

bqplot sends arrays to the browser as binary buffers, so redrawing thousands of points a
few times a second stays cheap. bqplot is imported when the first point arrives.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import ipywidgets as widgets

#: more ranks than this: mean and min-max band instead of a line each
MANY_RANKS = 8
#: points per line sent to the browser; longer series are thinned evenly
MAX_POINTS = 4000
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
        x, y = bqplot.LinearScale(), bqplot.LinearScale()
        axes = [
            bqplot.Axis(scale=x, side="bottom", label="step", num_ticks=5),
            bqplot.Axis(scale=y, side="left", label=name, num_ticks=4),
        ]
        self.many = len(ranks) > MANY_RANKS
        if self.many:
            self.band = bqplot.Lines(
                x=[], y=[], scales={"x": x, "y": y}, fill="between", colors=[COLORS[0]],
                fill_opacities=[0.2], stroke_width=0, labels=["min-max"],
            )  # fmt: skip
            self.mean = bqplot.Lines(
                x=[], y=[], scales={"x": x, "y": y}, colors=[COLORS[0]], labels=["mean"]
            )
            marks = [self.band, self.mean]
        else:
            self.lines = {
                r: bqplot.Lines(
                    x=[],
                    y=[],
                    scales={"x": x, "y": y},
                    colors=[COLORS[i % len(COLORS)]],
                    labels=[f"rank {r}"],
                    display_legend=True,
                )
                for i, r in enumerate(ranks)
            }
            marks = list(self.lines.values())
        self.figure = bqplot.Figure(
            marks=marks,
            axes=axes,
            title=name,
            legend_location="top-right",
            animation_duration=0,
            fig_margin={"top": 30, "bottom": 35, "left": 55, "right": 10},
            layout=widgets.Layout(width="360px", height="220px"),
        )
        self.figure.add_class("jd-metric")

    def update(self, series: dict[int, tuple[list[float], list[float]]]) -> None:
        import numpy as np

        if not self.many:
            with self.figure.hold_sync():
                for rank, line in self.lines.items():
                    xs, ys = series.get(rank, ([], []))
                    x, y = _thin(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
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
            with self.band.hold_sync():
                self.band.x, self.band.y = steps, np.vstack([low, high])
            with self.mean.hold_sync():
                self.mean.x, self.mean.y = steps, mean


class MetricsView:
    """Every metric of one cell; `render` redraws what changed since the last call."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks
        self.box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.box.add_class("jd-metrics")
        self.series: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
        self.charts: dict[str, MetricChart] = {}
        self._dirty: set[str] = set()

    def add(self, rank: int, points: tuple[tuple[str, float, float], ...]) -> None:
        for name, step, value in points:
            xs, ys = self.series.setdefault(name, {}).setdefault(rank, ([], []))
            xs.append(step)
            ys.append(value)
            self._dirty.add(name)

    def render(self) -> None:
        if not self._dirty:
            return
        for name in sorted(self._dirty):
            chart = self.charts.get(name)
            if chart is None:
                chart = self.charts[name] = MetricChart(name, self.ranks)
                self.box.children = (*self.box.children, chart.figure)
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
