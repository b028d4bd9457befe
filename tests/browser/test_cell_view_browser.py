"""The cell view in a real JupyterLab: status chips, switching to rank 1's output, a
metrics chart with a line per rank, the error chip of a failing rank, and the stacks
button answering while the ranks hang."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import rank_waits_for_file_cell

from .lab import OpenNotebook

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
RENDER_TIMEOUT_MS = 60_000

CELLS = [
    "%load_ext jupyter_dist",
    "%%distributed --procs 2\n"
    "import jupyter_dist\n"
    "me = jupyter_dist.info()\n"
    "for step in range(50):\n"
    "    jupyter_dist.log(loss=(1 + me.rank) / (step + 1))\n"
    "print(f'hello from rank {me.rank}')",
    "%%distributed\n"
    "if me.rank == 1:\n"
    "    raise RuntimeError('rank one fails here')\n"
    "print('rank zero is fine')",
]


def test_chips_rank_switch_metrics_and_error_chip(open_lab_notebook: OpenNotebook) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook("cell_view", CELLS)
    assert not nb.run_all(), "the last cell fails on rank 1, so the run must report a failure"

    view = nb.output(1).locator(".jd-cell-view")
    expect(view).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    for rank in (0, 1):
        chip = view.locator(f'.jd-chip[data-rank="{rank}"]')
        expect(chip).to_have_attribute("data-state", "done", timeout=RENDER_TIMEOUT_MS)

    # rank 0 is shown first; one click shows rank 1's output instead
    shown = view.locator(".jd-view:visible")
    expect(shown).to_contain_text("hello from rank 0", timeout=RENDER_TIMEOUT_MS)
    expect(shown).not_to_contain_text("hello from rank 1")
    view.locator(".jd-select button", has_text="rank 1").click()
    expect(view.locator(".jd-view:visible")).to_contain_text("hello from rank 1")
    expect(view.locator(".jd-view:visible")).not_to_contain_text("hello from rank 0")

    # one chart for the loss, one line per rank
    chart = view.locator(".jd-metric")
    expect(chart).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    expect(chart.locator("g.curve path.line")).to_have_count(2, timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("cell-view-rank1-and-chart", nb.cell(1))

    failed = nb.output(2).locator(".jd-cell-view")
    error_chip = failed.locator('.jd-chip[data-rank="1"]')
    expect(error_chip).to_have_attribute("data-state", "error", timeout=RENDER_TIMEOUT_MS)
    expect(failed.locator('.jd-chip[data-rank="0"]')).to_have_attribute("data-state", "done")
    expect(nb.output(2)).to_contain_text("RanksFailed")
    failed.locator(".jd-select button", has_text="rank 1").click()
    expect(failed.locator(".jd-view:visible")).to_contain_text("rank one fails here")
    nb.screenshot("cell-view-error-chip", nb.cell(2))
    assert nb.external_requests == []

    # saved with the widgets' state, the notebook shows the view again when reopened
    nb.save()
    saved = nb.lab.root / "cell_view.ipynb"
    meta = json.loads(saved.read_text())["metadata"]
    state = json.dumps(meta["widgets"]["application/vnd.jupyter.widget-state+json"])
    assert "hello from rank 1" in state and "jd-cell-view" in state
    shutil.copy(saved, nb.lab.root / "cell_view_saved.ipynb")
    again = open_lab_notebook("cell_view_saved", None)
    restored = again.output(1).locator(".jd-cell-view")
    expect(restored).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(restored.locator('.jd-chip[data-rank="1"]')).to_have_attribute("data-state", "done")
    # as it was saved: rank 1 chosen
    expect(restored.locator(".jd-view:visible")).to_contain_text("hello from rank 1")
    again.screenshot("cell-view-reopened", again.cell(1))


def test_the_stacks_button_shows_where_hanging_ranks_are(
    open_lab_notebook: OpenNotebook, tmp_path: Path
) -> None:
    """Rank 0 waits in all_reduce for rank 1, which waits for a file: a click on "stacks"
    while the cell runs shows both places; then the file lets the cell end."""
    from playwright.sync_api import expect

    go = tmp_path / "go"
    nb = open_lab_notebook(
        "stacks_button",
        [
            "%load_ext jupyter_dist",
            rank_waits_for_file_cell(go),
        ],
    )
    nb.start_all()
    try:
        view = nb.output(1).locator(".jd-cell-view")
        button = view.locator(".jd-stacks-button")
        expect(button).to_be_visible(timeout=RENDER_TIMEOUT_MS)
        stacks = view.locator(".jd-stacks")
        deadline = time.monotonic() + RENDER_TIMEOUT_MS / 1000
        shown = ""
        while time.monotonic() < deadline:  # until both ranks are in place
            expect(button).to_be_enabled(timeout=RENDER_TIMEOUT_MS)
            before = stacks.inner_text()
            button.click()
            shown = before
            while shown == before or "where the ranks were" not in shown:  # this click's
                time.sleep(0.1)
                shown = stacks.inner_text()
                assert time.monotonic() < deadline, f"the click was not answered: {shown!r}"
            if "rank 0: in all_reduce" in shown and "rank 1: at cell line 4" in shown:
                break
            time.sleep(1)
        assert "rank 0: in all_reduce" in shown and "rank 1: at cell line 4" in shown, shown
        chip = view.locator('.jd-chip[data-rank="0"]')
        expect(chip).to_have_attribute("data-state", "running")  # the cell still runs
        nb.screenshot("cell-view-stacks", nb.cell(1))
    finally:
        go.touch()
    assert nb.wait_all()
    expect(view.locator(".jd-view:visible")).to_contain_text("joined")
