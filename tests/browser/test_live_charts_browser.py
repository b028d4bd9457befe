"""Live charts in a real JupyterLab, sampled while the cell runs, as a person watches them:
each metric's chart draws a line that spreads along the step axis, with tick labels, from
the first points on; and the browser console stays free of chart errors."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from .lab import RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 60

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def cells(sampled: Path) -> list[str]:
    """Every step logs; a step takes 0.1 s until the test, done sampling, creates
    ``sampled``: then the rest run at once."""
    return [
        "%load_ext jupyter_dist",
        "%%distributed --procs 2\n"
        "import os, time, jupyter_dist\n"
        "me = jupyter_dist.info()\n"
        f"for step in range({STEPS}):\n"
        "    jupyter_dist.log(loss=(1 + me.rank) / (step + 1), acc=step / 100)\n"
        f"    time.sleep(0 if os.path.exists({str(sampled)!r}) else 0.1)\n"
        "print('trained')",
    ]


CHART_ERRORS = re.compile(r"invalid format|bqplot|NaN|undefined", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def line_xs(nb: NotebookPage, chart: int) -> list[set[float]]:
    """The distinct x positions of each line of the chart-th chart, as drawn now."""
    paths = nb.output(1).locator(".jd-metric").nth(chart).locator("g.curve path.line")
    found = []
    for d in paths.evaluate_all("els => els.map(e => e.getAttribute('d') || '')"):
        numbers = [float(n) for n in _NUMBER.findall(d)]
        found.append(set(numbers[0::2]))  # M x,y L x,y ...: every other number is an x
    return found


def tick_labels(nb: NotebookPage, chart: int) -> list[str]:
    ticks = nb.output(1).locator(".jd-metric").nth(chart).locator("g.tick text")
    texts = ticks.evaluate_all("els => els.map(e => e.textContent || '')")
    return [t.strip() for t in texts if t.strip()]


def is_live(sample: tuple[int, int, int, int]) -> bool:
    """Both charts drawn, each line at more than one x, with tick labels."""
    return min(sample[0], sample[1]) > 1 and min(sample[2], sample[3]) >= 2


def test_charts_draw_while_the_cell_runs(open_lab_notebook: OpenNotebook, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    sampled = tmp_path / "sampled"
    nb = open_lab_notebook("live_charts", cells(sampled))
    nb.start_all()
    charts = nb.output(1).locator(".jd-metric")
    expect(charts).to_have_count(2, timeout=RENDER_TIMEOUT_MS)
    # sample while the ranks still log: both charts spread along x, with tick labels
    samples: list[tuple[int, int, int, int]] = []
    deadline = time.monotonic() + STEPS * 0.1 + 60
    while time.monotonic() < deadline:
        running = "trained" not in nb.output(1).inner_text()
        if not running:
            break
        spread = [min((len(xs) for xs in line_xs(nb, c)), default=0) for c in (0, 1)]
        ticks = [len(tick_labels(nb, c)) for c in (0, 1)]
        samples.append((spread[0], spread[1], ticks[0], ticks[1]))
        if len(samples) == 3:
            nb.screenshot("live-charts-running", charts.first.locator("xpath=.."))
        if len(samples) >= 3 and is_live(samples[-1]):
            sampled.touch()  # seen drawn while it runs: the rest of the steps at once
        time.sleep(0.4)
    live = [s for s in samples if is_live(s)]
    assert live, f"no sample while the cell ran had both charts drawn with ticks: {samples}"
    assert nb.wait_all()
    nb.screenshot("live-charts-done", nb.cell(1))
    errors = [e for e in nb.console_errors if CHART_ERRORS.search(e)]
    assert not errors, errors[:5]


def test_the_live_metrics_demo_charts_its_loss_while_it_trains(
    open_lab_notebook: OpenNotebook,
) -> None:
    """The demo notebook as a user runs it: DDP training that logs a tensor loss each step."""
    from playwright.sync_api import expect

    demo = json.loads((NOTEBOOKS / "live_metrics.ipynb").read_text())
    cells = ["".join(c["source"]) for c in demo["cells"] if c["cell_type"] == "code"]
    training = next(i for i, c in enumerate(cells) if "jupyter_dist.log" in c)
    nb = open_lab_notebook("live_metrics_demo", cells[: training + 1])
    nb.start_all()  # it trains in seconds: the live chart, then the snapshot
    assert nb.wait_all()
    # the finished cell's snapshot draws the whole run as SVG
    done = nb.output(training).locator(".jd-snap-chart")
    expect(done).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("live-metrics-demo-done", done)
    points = done.locator("polyline").evaluate_all("els => els.map(e => e.getAttribute('points'))")
    spreads = [len({p.split(",")[0] for p in line.split()}) for line in points]
    assert len(spreads) == 2 and min(spreads) > 100, spreads  # 200 steps, a line per rank
    ticks = done.locator("text").evaluate_all("els => els.map(e => e.textContent)")
    assert {"0", "50", "100", "150", "200"} <= set(ticks), ticks
    # the bqplot errors came with the first points of each cell (a one-point domain)
    errors = [e for e in nb.console_errors if CHART_ERRORS.search(e)]
    assert not errors, errors[:5]
