"""The cell view follows JupyterLab's theme: in JupyterLab Dark no chip, live or in the
finished cell's snapshot, keeps a light background."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from .lab import RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook

if TYPE_CHECKING:
    from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
CELLS = [
    "%load_ext jupyter_dist",
    "%%distributed --procs 3\n"
    "import time, torch.distributed as dist\n"
    "time.sleep(2)\n"
    "if dist.get_rank() == 1:\n"
    "    raise RuntimeError('rank one fails here')\n"
    "dist.barrier()",
]
#: relative luminance (0 black .. 1 white) above which a background reads as light
LIGHT = 0.5
_LUMINANCE_JS = """els => els.filter(e => e.isConnected).map(e => {
    const m = getComputedStyle(e).backgroundColor.match(/[\\d.]+/g).map(Number);
    const lin = c => (c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    return 0.2126 * lin(m[0]) + 0.7152 * lin(m[1]) + 0.0722 * lin(m[2]);
})"""


def luminances(chips: Locator, count: int) -> list[float]:
    """The background luminance of ``count`` chips. A live view redraws its chips as ranks
    change state, so a chip may be replaced while it is read: read again until all of
    them were there."""
    deadline = time.monotonic() + RENDER_TIMEOUT_MS / 1000
    while True:
        values: list[float] = chips.evaluate_all(_LUMINANCE_JS)
        if len(values) == count or time.monotonic() > deadline:
            return values
        time.sleep(0.05)


def set_theme(nb: NotebookPage, theme: str) -> None:
    nb.page.evaluate(
        "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme
    )
    nb.page.wait_for_function(
        "t => document.body.dataset.jpThemeName === t", arg=theme, timeout=RENDER_TIMEOUT_MS
    )


def test_chips_are_dark_in_the_dark_theme(open_lab_notebook: OpenNotebook) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook("dark_theme", CELLS)
    set_theme(nb, "JupyterLab Dark")
    try:
        nb.start_all()
        live = nb.output(1).locator(".jd-cell-view:not(.jd-snapshot) .jd-chip")
        expect(live).to_have_count(3, timeout=RENDER_TIMEOUT_MS)
        time.sleep(0.5)
        running = luminances(live, 3)
        nb.screenshot("dark-theme-running", nb.cell(1))
        assert not nb.wait_all()
        snap = nb.output(1).locator(".jd-snapshot")
        chips = snap.locator(".jd-chip")
        expect(chips).to_have_count(3, timeout=RENDER_TIMEOUT_MS)
        expect(snap.locator('.jd-chip[data-rank="1"]')).to_have_attribute("data-state", "error")
        finished = luminances(chips, 3)
        nb.screenshot("dark-theme-finished", nb.cell(1))
        assert max(running) < LIGHT, running
        assert max(finished) < LIGHT, finished
    finally:
        set_theme(nb, "JupyterLab Light")
