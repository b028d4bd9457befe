"""The cell view in a real JupyterLab: the snapshot a finished cell leaves (chips, every
rank's output, the failing rank's open with its traceback shown once, the chart, the logs
link), as it is and reopened from the saved file with default settings, after a session
restart, and the stacks button answering while the ranks hang."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import rank_waits_for_file_cell

from .lab import RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook

if TYPE_CHECKING:
    from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

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


def test_finished_cells_are_snapshots_that_survive_reopening(
    open_lab_notebook: OpenNotebook, kernel_name: str
) -> None:
    """A finished cell shows its snapshot: chips, each rank's output (the failing rank's
    open), the chart; saved and reopened with JupyterLab's default settings (no widget
    state) it shows the same, and so does nbconvert's HTML of the file."""
    from playwright.sync_api import expect

    nb = open_lab_notebook("cell_view", CELLS)
    assert not nb.run_all(), "the last cell fails on rank 1, so the run must report a failure"

    check_snapshots(nb)
    check_one_traceback(nb, 2, "rank 1's output")
    check_chip_opens_its_rank_and_logs_open(nb)
    nb.screenshot("cell-view-snapshot", nb.cell(1))
    nb.screenshot("cell-view-error-first", nb.cell(2))
    assert nb.external_requests == []

    nb.save()
    saved = nb.lab.root / "cell_view.ipynb"
    assert "widget-view+json" not in saved.read_text()  # nothing that needs a kernel
    shutil.copy(saved, nb.lab.root / "cell_view_saved.ipynb")
    again = open_lab_notebook("cell_view_saved", None)
    expect(again.output(1).locator(".jd-snapshot")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    check_snapshots(again)
    for i in (1, 2):
        assert "model not found" not in again.output(i).inner_text()
    again.screenshot("cell-view-reopened", again.cell(2))

    html = nbconvert_html(saved)
    for text in ("hello from rank 0", "hello from rank 1", "rank one fails here"):
        assert text in html, text
    assert html.count('class="jd-snap-line"') == 2  # the loss chart, a line per rank


def check_picking_views_while_it_runs(nb: NotebookPage, view: Locator) -> None:
    """While the cell runs: a click on rank 1's chip shows rank 1's view; the selector is
    reachable by keyboard (Tab, Enter) and says each rank's state in its tooltips."""
    from playwright.sync_api import expect

    buttons = view.locator(".jd-select button")
    # a slow press while the chips are redrawn each tick still picks the rank
    view.locator('.jd-chip[data-rank="1"]').hover()
    nb.page.mouse.down()
    nb.page.wait_for_timeout(1500)
    nb.page.mouse.up()
    expect(buttons.nth(1)).to_have_class(re.compile(r"mod-active"))
    expect(buttons.nth(1)).to_have_attribute("title", "rank 1: running")
    buttons.nth(1).focus()
    nb.page.keyboard.press("Shift+Tab")
    nb.page.keyboard.press("Enter")
    expect(buttons.nth(0)).to_have_class(re.compile(r"mod-active"))


def check_snapshots(nb: NotebookPage) -> None:
    from playwright.sync_api import expect

    snap = nb.output(1).locator(".jd-snapshot")
    expect(snap).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    for rank in (0, 1):
        chip = snap.locator(f'.jd-chip[data-rank="{rank}"]')
        expect(chip).to_have_attribute("data-state", "done")
    # every rank's output is open, each line with its rank; a rank's own block opens on a
    # click
    every = snap.locator("details.jd-snap-all")
    expect(every).to_have_attribute("open", "")
    expect(every.get_by_text("[rank 0] hello from rank 0")).to_be_visible()
    expect(every.get_by_text("[rank 1] hello from rank 1")).to_be_visible()
    rank0 = snap.locator('details.jd-snap-rank[data-rank="0"]')
    rank1 = snap.locator('details.jd-snap-rank[data-rank="1"]')
    expect(rank0).not_to_have_attribute("open", "")
    expect(rank1.get_by_text("hello from rank 1")).to_be_hidden()
    rank1.locator("summary").click()
    expect(rank1.get_by_text("hello from rank 1")).to_be_visible()
    # the chart, a line per rank spread along the steps
    lines = snap.locator(".jd-snap-chart polyline")
    expect(lines).to_have_count(2)
    for points in lines.evaluate_all("els => els.map(e => e.getAttribute('points'))"):
        assert len(set(points.split())) > 40, points

    failed = nb.output(2).locator(".jd-snapshot")
    expect(failed.locator('.jd-chip[data-rank="1"]')).to_have_attribute("data-state", "error")
    expect(failed.locator('.jd-chip[data-rank="0"]')).to_have_attribute("data-state", "done")
    expect(nb.output(2)).to_contain_text("RanksFailed")
    # the culprit's block is the open one
    culprit = failed.locator('details.jd-snap-rank[data-rank="1"]')
    expect(culprit).to_have_attribute("open", "")
    expect(culprit).to_contain_text("rank one fails here")
    # the rank's traceback names the cell as the notebook numbers it
    prompt = nb.cell(2).locator(".jp-InputPrompt").inner_text()
    count = re.search(r"\[(\d+)\]", prompt)
    assert count is not None, prompt
    expect(culprit).to_contain_text(f"Cell In[{count.group(1)}], line 2")
    expect(failed.locator('details.jd-snap-rank[data-rank="0"]')).not_to_have_attribute("open", "")


def check_one_traceback(nb: NotebookPage, cell: int, whose: str) -> None:
    """What a person sees of a failed cell: the traceback once, in the open block of the
    rank that failed; the cell's error below names the failure and points there."""
    from playwright.sync_api import expect

    out = nb.output(cell)
    expect(out.locator(".jd-snapshot")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(out).to_contain_text("RanksFailed")
    seen = out.inner_text()  # what is shown: a closed block's text is not
    assert seen.count("Traceback (most recent call last)") == 1, seen
    error = out.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    expect(error.last).to_contain_text(f"(the traceback is above, in {whose})")
    expect(error.last).not_to_contain_text("Traceback")


def check_chip_opens_its_rank_and_logs_open(nb: NotebookPage) -> None:
    """In a cell run in this browser (trusted output), a chip opens its rank's block; the
    footer's log folder is a link the server serves, to each rank's whole output."""
    from playwright.sync_api import expect

    failed = nb.output(2).locator(".jd-snapshot")
    rank0 = failed.locator('details.jd-snap-rank[data-rank="0"]')
    expect(rank0).not_to_have_attribute("open", "")
    failed.locator('.jd-chip[data-rank="0"]').click()
    expect(rank0).to_have_attribute("open", "")

    link = nb.output(1).locator("a.jd-logs")
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href is not None and href.startswith("/jupyter-dist/logs/jupyter_dist-logs-"), href
    logs = nb.page.context.new_page()
    try:
        logs.goto(nb.lab.url.rstrip("/") + href)
        expect(logs.locator("a", has_text="rank-1.log")).to_be_visible()
        logs.locator("a", has_text="rank-1.log").click()
        expect(logs.locator("body")).to_contain_text("hello from rank 1")
    finally:
        logs.close()


def test_a_cell_after_a_restart_shows_its_traceback_once_and_links_its_logs(
    open_lab_notebook: OpenNotebook,
) -> None:
    """After ``%dist restart`` the ranks' variables are gone, and a cell using one raises
    on every rank without printing anything: the traceback is shown once, and the footer's
    logs link opens each rank's log, which holds it."""
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "after_restart",
        [
            "%load_ext jupyter_dist",
            "%%distributed --procs 2\nkept = 1",
            "%dist restart",
            "%%distributed\nprint(kept)",
        ],
    )
    assert not nb.run_all(), "the last cell raises a NameError on every rank"
    check_one_traceback(nb, 3, "the ranks' output")
    out = nb.output(3)
    culprit = out.locator('details.jd-snap-rank[data-rank="0"]')
    expect(culprit).to_have_attribute("open", "")
    expect(culprit).to_contain_text("NameError: name 'kept' is not defined")
    # the cell's error, a line longer than the notebook is wide, wraps between words (as
    # JupyterLab's outputs do not), as the rank's output does
    error = out.locator(".jp-OutputArea-output pre", has_text="RanksFailed")
    expect(error).to_contain_text("root cause on rank")
    assert error.evaluate("(pre) => pre.getClientRects()[0].height") > 30  # it wraps
    broken = [cut for pre in out.locator("pre").all() for cut in pre.evaluate(_MID_WORD_BREAKS_JS)]
    assert broken == [], broken
    link = out.locator("a.jd-logs")
    expect(link).to_be_visible()
    nb.screenshot("cell-view-after-restart", nb.cell(3))
    href = link.get_attribute("href")
    assert href is not None and href.startswith("/jupyter-dist/logs/jupyter_dist-logs-"), href
    logs = nb.page.context.new_page()
    try:
        logs.goto(nb.lab.url.rstrip("/") + href + "rank-1.log")
        expect(logs.locator("body")).to_contain_text("NameError: name 'kept' is not defined")
        expect(logs.locator("body")).to_contain_text("Traceback (most recent call last)")
    finally:
        logs.close()
    assert nb.console_errors == [], nb.console_errors


# the places where the text of ``pre`` goes on to a new line after a letter and before
# another (a word cut in two), each with the text around it
_MID_WORD_BREAKS_JS = """(pre) => {
    const cuts = [];
    let lastTop = null, prev = '';
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const node = walker.currentNode;
        for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            const rect = range.getBoundingClientRect();
            const ch = node.data[i];
            if (rect.height === 0 || ch === '\\n') { prev = ch; continue; }
            if (lastTop !== null && rect.top > lastTop + 2 && /\\w/.test(prev) && /\\w/.test(ch)) {
                cuts.push(node.data.slice(Math.max(0, i - 12), i + 12));
            }
            lastTop = rect.top;
            prev = ch;
        }
    }
    return cuts;
}"""


def nbconvert_html(path: Path) -> str:
    out = path.with_suffix(".html")
    subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(path), "--output", out.name],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out.read_text()


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
        check_picking_views_while_it_runs(nb, view)
    finally:
        go.touch()
    assert nb.wait_all()
    # the finished cell's snapshot: rank 0's block has the line both ranks printed
    snap = nb.output(1).locator('.jd-snapshot details[data-rank="0"]')
    expect(snap).to_contain_text("joined", timeout=RENDER_TIMEOUT_MS)
