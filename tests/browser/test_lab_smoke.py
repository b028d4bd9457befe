"""The harness end to end: a notebook run in a real JupyterLab renders text, ipywidgets and
a ``%%distributed`` cell's output from both ranks."""

from __future__ import annotations

import pytest

from .lab import RENDER_TIMEOUT_MS, OpenNotebook

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


CELLS = [
    "print('hello')",
    "import ipywidgets as widgets\n"
    "slider = widgets.IntSlider(value=3, max=10, description='smoke')\n"
    "note = widgets.HTML('<b data-test=\"smoke-note\">widgets render</b>')\n"
    "note.add_class('smoke-html')\n"
    "widgets.VBox([slider, note])",
    "%load_ext jupyter_dist",
    "%%distributed --procs 2\n"
    "import jupyter_dist\n"
    "me = jupyter_dist.info()\n"
    "print(f'rank {me.rank} of {me.world_size}')",
]


def test_notebook_renders_text_widgets_and_ranks(open_lab_notebook: OpenNotebook) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook("smoke", CELLS)
    assert nb.run_all(), "a cell failed"

    expect(nb.output(0)).to_contain_text("hello")

    slider = nb.output(1).locator(".widget-slider")
    expect(slider).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(slider.locator(".widget-readout")).to_contain_text("3")
    note = nb.output(1).locator(".smoke-html [data-test=smoke-note]")
    expect(note).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(note).to_have_text("widgets render")

    # the finished cell shows every rank's output, each line with its rank
    ranks = nb.output(3)
    every = ranks.locator("details.jd-snap-all")
    expect(every.get_by_text("rank 0 of 2")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(every.get_by_text("rank 1 of 2")).to_be_visible(timeout=RENDER_TIMEOUT_MS)

    shot = nb.screenshot("lab-smoke")
    assert shot.stat().st_size > 0
    assert nb.external_requests == []
    assert nb.console_errors == []
