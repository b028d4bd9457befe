"""Widgets a rank makes render live in a real JupyterLab: an ipywidgets progress bar the
rank drives, tqdm.auto's bar and rich's progress (an Output widget the notebook side
fills) advance in the all-ranks view a cell opens on, rank 0's, with rank 1's folded into
one line under them; each rank's own view draws its own; no widget errors on the page or
in the browser console."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .lab import RENDER_TIMEOUT_MS, OpenNotebook

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 400


def cells(sampled: Path) -> list[str]:
    """Every step moves the three bars, one every 0.15 s, until the test, done sampling,
    creates ``sampled`` (a loaded machine may take its time to draw: the loop runs until
    the test has seen what it looks for)."""
    return [
        "%load_ext jupyter_dist",
        "%%distributed --procs 2\n"
        "import os, time, ipywidgets\n"
        "from IPython.display import display\n"
        "from rich.progress import Progress\n"
        "from tqdm.auto import tqdm\n"
        f"bar = ipywidgets.IntProgress(min=0, max={STEPS}, description='steps')\n"
        "display(bar)\n"
        # tqdm's bar is displayed before rich's live display starts: rich's refresh thread
        # captures every output of the cell while it redraws (its Output widget's msg_id, in
        # a browser as here), and a display made then would go into rich's widget
        f"epochs = tqdm(range({STEPS}), desc='epoch')\n"
        "with Progress() as progress:\n"
        f"    task = progress.add_task('rich', total={STEPS})\n"
        "    for i in epochs:\n"
        "        bar.value = i + 1\n"
        "        progress.advance(task)\n"
        f"        if os.path.exists({str(sampled)!r}):\n"
        "            break\n"
        "        time.sleep(0.15)\n"
        "print('loop done')",
    ]


WIDGET_ERRORS = re.compile(
    r"model not found|Wrong widget protocol version|Error displaying widget|"
    r"Could not create (a )?(model|view)",
    re.IGNORECASE,
)


def test_rank_0s_progress_bars_advance_in_the_all_ranks_view_while_the_cell_runs(
    open_lab_notebook: OpenNotebook, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    sampled = tmp_path / "sampled"
    nb = open_lab_notebook("rank_widgets", cells(sampled))
    nb.start_all()
    view = nb.output(1).locator(".jd-cell-view")
    expect(view).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    shown = view.locator(".jd-view:visible")  # the all-ranks view, where a cell opens
    bars = shown.locator(".widget-hprogress .progress-bar")
    rich = shown.locator(".widget-output", has_text="rich")
    try:
        # rank 0's bars (the IntProgress and tqdm's) and its rich progress, live there;
        # rank 1's folded into one line
        expect(bars).to_have_count(2, timeout=RENDER_TIMEOUT_MS)
        expect(rich).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
        expect(shown).to_contain_text("[rank 1] live progress: in rank 1's own view")
        widths: set[str] = set()
        frames: set[str] = set()
        deadline = time.monotonic() + STEPS * 0.15
        while time.monotonic() < deadline and (len(widths) < 3 or len(frames) < 3):
            if "loop done" in shown.inner_text():
                break
            widths.add(bars.first.get_attribute("style") or "")
            frames.add(rich.inner_text())
            time.sleep(0.3)
        nb.screenshot("rank-widgets-all-ranks-running", nb.cell(1))
        view.locator(".jd-select button").nth(1).click()  # rank 1's view: its own bars
        expect(shown.locator(".widget-hprogress")).to_have_count(2)
        expect(shown.locator(".widget-output", has_text="rich")).to_have_count(1)
        nb.screenshot("rank-widgets-rank-1-running", nb.cell(1))
    finally:
        sampled.touch()  # seen advancing: the loop ends
    assert len(widths) >= 3, f"the bar did not advance in the all-ranks view: {widths}"
    assert len(frames) >= 3, f"rich's progress did not advance there: {frames}"
    assert nb.wait_all()
    # the finished cell's snapshot keeps the bars' last state (tqdm's line, rich's frame)
    snap = nb.output(1).locator('.jd-snapshot details[data-rank="0"]')
    expect(snap).to_contain_text("loop done", timeout=RENDER_TIMEOUT_MS)
    expect(snap).to_contain_text(re.compile(rf"epoch:[\s\S]*\d+/{STEPS}"))
    expect(snap).to_contain_text(re.compile(r"rich[\s\S]*\d+%"))
    assert not WIDGET_ERRORS.search(nb.output(1).inner_text())
    widget_errors = [e for e in nb.console_errors if WIDGET_ERRORS.search(e)]
    assert not widget_errors, widget_errors
    nb.screenshot("rank-widgets-done", nb.cell(1))
