"""A full temporary folder as a person sees it in JupyterLab: the cell's output arrives
while it runs, with one notice that the rank logs are off, and the finished cell keeps
every line; the browser console stays clean.

The notebook kernel's temporary folder is a real tmpfs filled to the last page (set in a
plain cell before the first ``%%distributed`` cell, as ``TMPDIR`` would)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_full_temp_folder import NOTICE, fill, small_tmpfs

from .lab import RENDER_TIMEOUT_MS, OpenNotebook

__all__ = ["small_tmpfs"]  # the fixture, used by name
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
LINES = 40


@pytest.fixture
def full_folder(small_tmpfs: Path) -> Iterator[Path]:
    fill(small_tmpfs)
    yield small_tmpfs


def test_a_full_disk_shows_one_notice_and_every_line_while_the_cell_runs(
    open_lab_notebook: OpenNotebook, full_folder: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    sampled = tmp_path / "sampled"  # a line takes 0.1 s until the test saw the notice
    nb = open_lab_notebook(
        "full_disk",
        [
            "%load_ext jupyter_dist",
            f"import tempfile\ntempfile.tempdir = {str(full_folder)!r}",
            "%%distributed --procs 2\nimport os, time\n"
            f"for i in range({LINES}):\n"
            "    print(f'line {i} ' + 'x' * 500, flush=True)\n"
            f"    time.sleep(0 if os.path.exists({str(sampled)!r}) else 0.1)\n"
            "print('finished')",
        ],
    )
    nb.start_all()  # lines of 500 characters: the log's first write to the disk is mid-cell
    out = nb.output(2)
    expect(out).to_contain_text("line 1", timeout=RENDER_TIMEOUT_MS)
    # sampled while the ranks still print: lines arrive, and the notice is there once
    samples: list[tuple[bool, int]] = []
    deadline = time.monotonic() + LINES * 0.1 + 60
    while time.monotonic() < deadline:
        text = out.inner_text()
        if "finished" in text:
            break
        samples.append(("line " in text, text.count(NOTICE)))
        if samples[-1][1] and not any(n for _, n in samples[:-1]):  # as it appears
            notice = out.get_by_text(NOTICE).filter(visible=True)
            notice.scroll_into_view_if_needed()
            expect(notice).to_be_visible()
            nb.screenshot("full-disk-running-notice", notice.locator("xpath=.."))
        if len([n for _, n in samples if n]) >= 2:
            sampled.touch()  # the notice seen, and seen once still: the rest at once
        time.sleep(0.3)
    assert any(lines and notices == 1 for lines, notices in samples), samples
    assert all(notices <= 1 for _, notices in samples), samples
    assert nb.wait_all()
    done = out.inner_text()
    notice = out.get_by_text(NOTICE).filter(visible=True)
    notice.scroll_into_view_if_needed()
    expect(notice).to_be_visible()
    nb.screenshot("full-disk-done-notice", notice.locator("xpath=.."))
    assert done.count(NOTICE) == 1, done
    assert str(full_folder) in done
    # no link to logs that were not kept
    assert f"logs: {full_folder}" not in done, done
    expect(out.locator("a.jd-logs")).to_have_count(0)
    for rank in (0, 1):
        nb.output(2).get_by_text(f"rank {rank}", exact=False).first.click()
    text = out.inner_text()
    assert f"line {LINES - 1}" in text and "finished" in text, text
    assert nb.console_errors == [], nb.console_errors
