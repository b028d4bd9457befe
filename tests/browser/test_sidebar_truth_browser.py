"""The sidebar says what is, in a real JupyterLab: a labelled tab, a command in the palette
and the View menu, a pointer from the first cell; a rank's log holds what it printed and
raised, its diagnostics apart; a session whose rank is stuck is not "ready", and after a
restart no rank shows an error of the ranks before; the new-session form marks a bad
value at its field and keeps what was typed."""

from __future__ import annotations

import re

import pytest

from .lab import RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook
from .test_sidebar_browser import session_card, show_sidebar

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
SESSION = "truth"
POINTER = "the Distributed sidebar (View > Show distributed sessions)"
#: rank 0 sleeps on while rank 1 is done: past the straggler threshold, stuck
STUCK = (
    f"%%distributed --session {SESSION}\n"
    "import time, torch.distributed as dist\n"
    "if dist.get_rank() == 0:\n"
    "    time.sleep(900)"
)


def hide_sidebar(nb: NotebookPage) -> None:
    from playwright.sync_api import expect

    nb.page.locator('.jp-SideBar [data-id="filebrowser"]').click()
    expect(nb.page.locator("#jupyter-dist-sidebar")).to_be_hidden(timeout=RENDER_TIMEOUT_MS)


def test_tab_palette_menu_pointer_and_a_ranks_log(open_lab_notebook: OpenNotebook) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "sidebar_truth_log",
        [
            "%load_ext jupyter_dist",
            f"%%distributed --procs 2 --session {SESSION}\n"
            "import os\nprint('hello from rank', os.environ['RANK'])",
            f"%%distributed --session {SESSION}\n"
            "import os\nif os.environ['RANK'] == '1':\n"
            "    raise ValueError('rank one only raised')",
        ],
    )
    # the tab says what it is
    tab = nb.page.locator('.jp-SideBar [data-id="jupyter-dist-sidebar"]')
    expect(tab).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(tab.locator(".lm-TabBar-tabLabel")).to_have_text("Distributed")
    expect(tab.locator(".lm-TabBar-tabLabel")).to_be_visible()
    nb.screenshot("sidebar-truth-tab", nb.page.locator(".jp-SideBar.jp-mod-left"))

    # the command palette opens it
    nb.page.keyboard.press("Control+Shift+C")
    palette = nb.page.locator("#command-palette")
    expect(palette).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    palette.locator("input").fill("Show distributed sessions")
    item = palette.locator(".lm-CommandPalette-item", has_text="Show distributed sessions")
    expect(item).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("sidebar-truth-palette")
    item.click()
    expect(nb.page.locator("#jupyter-dist-sidebar")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    # and so does the View menu
    hide_sidebar(nb)
    nb.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^View$")).click()
    entry = nb.page.locator(".lm-Menu-item", has_text="Show distributed sessions")
    expect(entry).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("sidebar-truth-view-menu")
    entry.click()
    expect(nb.page.locator("#jupyter-dist-sidebar")).to_be_visible(timeout=RENDER_TIMEOUT_MS)

    assert not nb.run_all(), "the cell that raises on rank 1 did not fail"
    # the cell that started the session points at the sidebar, once
    expect(nb.output(1)).to_contain_text(POINTER)
    assert nb.output(1).inner_text().count(POINTER) == 1
    expect(nb.output(2)).not_to_contain_text(POINTER)

    card = session_card(nb, SESSION)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    card.get_by_role("button", name=f"Open session {SESSION}").click()
    rank1 = card.locator('.jp-DistRank[data-rank="1"]')
    expect(rank1.locator(".jp-DistRank-error")).to_contain_text("ValueError: rank one only raised")
    rank1.locator("button", has_text="log").click()
    log = nb.page.locator("#jupyter-dist-log-truth-1 .jp-DistLog")
    text = log.locator("pre")
    expect(text).to_contain_text("hello from rank 1", timeout=RENDER_TIMEOUT_MS)
    expect(text).to_contain_text("Traceback", timeout=RENDER_TIMEOUT_MS)
    expect(text).to_contain_text("ValueError: rank one only raised")
    expect(text).not_to_contain_text("hello from rank 0")
    output_tab = log.get_by_role("tab", name="Output")
    expect(output_tab).to_have_attribute("aria-selected", "true")
    nb.screenshot("sidebar-truth-rank-log")
    # the process's diagnostics on the second tab, without the cells' output
    log.get_by_role("tab", name="Diagnostics").click()
    expect(log.get_by_role("tab", name="Diagnostics")).to_have_attribute("aria-selected", "true")
    expect(text).not_to_contain_text("hello from rank 1", timeout=RENDER_TIMEOUT_MS)
    nb.page.wait_for_timeout(1500)  # a poll or two later: still apart
    assert "hello from rank 1" not in text.inner_text()
    assert "rank one only raised" not in text.inner_text()
    nb.screenshot("sidebar-truth-diagnostics")
    log.get_by_role("tab", name="Output").click()
    expect(text).to_contain_text("hello from rank 1", timeout=RENDER_TIMEOUT_MS)

    # the session shut down: the tab keeps what it showed, says so, and asks no more
    asked: list[str] = []
    nb.page.on("request", lambda r: asked.append(r.url) if "/ranks/1/log" in r.url else None)
    status, _ = nb.lab.call("DELETE", f"/jupyter-dist/api/v1/sessions/{SESSION}")
    assert status == 204
    ended = log.locator(".jp-DistLog-ended")
    expect(ended).to_contain_text("No longer followed", timeout=RENDER_TIMEOUT_MS)
    expect(ended).to_contain_text(SESSION)
    expect(text).to_contain_text("hello from rank 1")
    nb.screenshot("sidebar-truth-log-ended")
    before = len(asked)
    nb.page.wait_for_timeout(3000)  # three polls' time: none goes out
    assert len(asked) == before, asked[before:]
    ours = [
        e
        for e in nb.console_errors
        if ("jupyter-dist" in e or "Dist" in e) and "404" not in e  # the one that ended it
    ]
    assert not ours, ours


def test_a_stuck_rank_is_not_ready_and_a_restart_leaves_no_old_error(
    open_lab_notebook: OpenNotebook,
) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "sidebar_truth_stuck",
        ["%load_ext jupyter_dist", f"%%distributed --procs 2 --session {SESSION}\nx = 1", STUCK],
    )
    show_sidebar(nb)
    nb.start_all()
    card = session_card(nb, SESSION)
    expect(card).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    badge = card.locator(".jp-DistSession-state")
    rank0 = card.locator('.jp-DistRank[data-rank="0"]')
    # while the cell runs: busy, with how long, never the green "ready"
    expect(badge).to_have_text(re.compile(r"^busy \d+ s$"), timeout=RENDER_TIMEOUT_MS)
    # a slow click while the busy time ticks (a redraw each second) still opens the card:
    # the redraw waits for the release, so press and release land on the same button
    toggle = card.get_by_role("button", name=f"Open session {SESSION}")
    toggle.hover()
    nb.page.mouse.down()
    nb.page.wait_for_timeout(1500)
    nb.page.mouse.up()
    expect(card).to_have_attribute("aria-expanded", "true")
    threshold = float(
        nb.lab.call("GET", f"/jupyter-dist/api/v1/sessions/{SESSION}")[1]["straggler_s"]
    )
    # past the threshold, rank 0 busy beside rank 1 that finished: stuck, sampled as it is
    expect(badge).to_have_text(
        re.compile(r"^stuck \d+ (s|min \d+ s)$"), timeout=(threshold + 60) * 1000
    )
    expect(badge).to_have_class(re.compile(r"jp-mod-stuck"))
    expect(rank0.locator(".jp-DistBadge").first).to_have_text("stuck")
    expect(card.locator('.jp-DistRank[data-rank="1"] .jp-DistBadge').first).to_have_text("idle")
    expect(card.locator(".jp-DistSession-error.jp-mod-stuck")).to_contain_text("rank 0 busy for")
    states = nb.page.locator("#jupyter-dist-sidebar .jp-DistSession-state")
    assert "ready" not in states.all_inner_texts()
    # the stuck time ticks each second (polled; a loaded machine may draw late)
    expect(badge, "the stuck time does not tick").not_to_have_text(
        badge.inner_text(), timeout=10_000
    )
    nb.screenshot("sidebar-truth-stuck", nb.page.locator("#jupyter-dist-sidebar"))

    # restarted from the panel: the cell ends, and the fresh ranks carry no error of it
    card.locator("button.jp-DistButton", has_text="Restart").first.click()
    nb.page.locator(".jp-Dialog").get_by_role("button", name="Restart").click()
    assert not nb.wait_all(), "the cell whose ranks were restarted did not fail"
    expect(badge).to_have_text("ready", timeout=RENDER_TIMEOUT_MS)
    for _ in range(6):  # sampled for a while after the cell ended: still no old error
        expect(card.locator(".jp-DistRank-error")).to_have_count(0)
        expect(card.locator(".jp-DistRank .jp-DistBadge.jp-mod-error")).to_have_count(0)
        nb.page.wait_for_timeout(500)
    expect(card.locator(".jp-DistRank-label")).to_have_text("ranks 0-1")  # idle, folded
    nb.screenshot("sidebar-truth-after-restart", nb.page.locator("#jupyter-dist-sidebar"))
    ours = [e for e in nb.console_errors if "jupyter-dist" in e or "Dist" in e]
    assert not ours, ours


def test_the_form_marks_a_bad_value_at_its_field_and_keeps_what_was_typed(
    open_lab_notebook: OpenNotebook,
) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook("sidebar_truth_form", ["1"])
    show_sidebar(nb)
    nb.page.locator("#jupyter-dist-sidebar").get_by_role(
        "button", name="Start a new session"
    ).click()
    dialog = nb.page.locator(".jp-Dialog")
    form = dialog.locator(".jp-DistForm")
    form.locator('input[name="name"]').fill("keepme")
    form.locator('input[name="nodes"]').fill("1")
    count = form.locator('input[name="count"]')
    count.fill("abc")
    dialog.get_by_role("button", name="Start").click()
    # the form's own check: the dialog stays, the field is marked, nothing typed is lost
    expect(count).to_have_attribute("aria-invalid", "true", timeout=RENDER_TIMEOUT_MS)
    error = form.locator("#jp-DistForm-error-count")
    expect(error).to_be_visible()
    expect(error).to_contain_text("'abc': expected a number of processes per node")
    expect(form.locator('input[name="name"]')).to_have_value("keepme")
    expect(count).to_have_value("abc")
    nb.screenshot("sidebar-truth-form-bad", dialog.locator(".jp-Dialog-content"))
    # the server's check: a count of 0 is marked at the same field, with its message
    count.fill("0")
    expect(error).to_be_hidden()  # typing clears the mark
    dialog.get_by_role("button", name="Start").click()
    expect(error).to_contain_text("'0': expected", timeout=RENDER_TIMEOUT_MS)
    expect(error).not_to_contain_text("--procs")  # the form's words, not a flag's
    expect(count).to_have_attribute("aria-invalid", "true")
    expect(dialog).to_be_visible()
    expect(form.locator('input[name="name"]')).to_have_value("keepme")
    nb.screenshot("sidebar-truth-form-server", dialog.locator(".jp-Dialog-content"))
    assert nb.lab.call("GET", "/jupyter-dist/api/v1/sessions")[1] == []  # nothing started
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    ours = [e for e in nb.console_errors if "jupyter-dist" in e or "Dist" in e]
    assert not ours, ours
