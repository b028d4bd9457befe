"""Widgets a rank makes render in that rank's view, live, in a real JupyterLab: an
ipywidgets progress bar the rank drives and tqdm.auto's bar, with no widget errors on the
page or in the browser console; the all-ranks view does not draw them again."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .lab import RENDER_TIMEOUT_MS, OpenNotebook

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 40


def cells(sampled: Path) -> list[str]:
    """Every step moves both bars; a step takes 0.15 s until the test, done sampling,
    creates ``sampled``: then the rest run at once."""
    return [
        "%load_ext jupyter_dist",
        "%%distributed --procs 2\n"
        "import os, time, ipywidgets\n"
        "from IPython.display import display\n"
        "from tqdm.auto import tqdm\n"
        f"bar = ipywidgets.IntProgress(min=0, max={STEPS}, description='steps')\n"
        "display(bar)\n"
        f"for i in tqdm(range({STEPS}), desc='epoch'):\n"
        "    bar.value = i + 1\n"
        f"    time.sleep(0 if os.path.exists({str(sampled)!r}) else 0.15)\n"
        "print('loop done')",
    ]


WIDGET_ERRORS = re.compile(
    r"model not found|Wrong widget protocol version|Error displaying widget|"
    r"Could not create (a )?(model|view)",
    re.IGNORECASE,
)


def test_a_ranks_progress_bars_render_and_advance_while_the_cell_runs(
    open_lab_notebook: OpenNotebook, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    sampled = tmp_path / "sampled"
    nb = open_lab_notebook("rank_widgets", cells(sampled))
    nb.start_all()
    view = nb.output(1).locator(".jd-cell-view")
    expect(view).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    shown = view.locator(".jd-view:visible")
    bars = shown.locator(".widget-hprogress .progress-bar")
    # the all-ranks view, shown first: neither rank's bars again, one line saying where
    expect(shown).to_contain_text(
        "(a live display: see the rank's own view)", timeout=RENDER_TIMEOUT_MS
    )
    assert bars.count() == 0 and "loop done" not in shown.inner_text()
    nb.screenshot("rank-widgets-all-ranks-running", nb.cell(1))
    view.locator(".jd-select button").nth(0).click()  # rank 0's view
    # two bars in rank 0's view: the IntProgress and tqdm's; sample them while the cell runs
    expect(bars).to_have_count(2, timeout=RENDER_TIMEOUT_MS)
    widths: set[str] = set()
    deadline = time.monotonic() + STEPS * 0.15 + 30
    while time.monotonic() < deadline and len(widths) < 3:
        if "loop done" in shown.inner_text():
            break
        style = bars.first.get_attribute("style") or ""
        widths.add(style)
        time.sleep(0.3)
    sampled.touch()  # seen advancing: the rest of the steps at once
    assert len(widths) >= 3, f"the bar did not advance while the cell ran: {widths}"
    nb.screenshot("rank-widgets-running", nb.cell(1))
    assert nb.wait_all()
    # the finished cell's snapshot keeps the bars' text (tqdm's final line)
    snap = nb.output(1).locator('.jd-snapshot details[data-rank="0"]')
    expect(snap).to_contain_text("loop done", timeout=RENDER_TIMEOUT_MS)
    expect(snap).to_contain_text(f"{STEPS}/{STEPS}")
    assert not WIDGET_ERRORS.search(nb.output(1).inner_text())
    widget_errors = [e for e in nb.console_errors if WIDGET_ERRORS.search(e)]
    assert not widget_errors, widget_errors
    nb.screenshot("rank-widgets-done", nb.cell(1))
