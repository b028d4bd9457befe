"""A console on a rank, opened from the sidebar in a real JupyterLab: Kernel > Interrupt
stops the rank's running code, the console's Restart restarts that rank alone (asked once,
by JupyterLab), the console then runs on the new rank (after a restart from anywhere), a
collective typed there is refused unrun, JupyterLab's debugger pauses a console cell at a
breakpoint set in its gutter (the line highlighted, a variable's value shown) until
Continue, and when the session is shut down the console closes saying why, with no error
in the browser's console."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from .lab import DIST_API, RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook
from .test_sidebar_browser import session_card, show_sidebar

if TYPE_CHECKING:
    from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
SESSION = "consoles"
#: the cell the debugger pauses on its line 3, with b = 42
DEBUGGED_CELL = "a = 6\nb = a * 7\nprint('b is', b)"


def kernel_menu(nb: NotebookPage, item: str) -> None:
    nb.page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    nb.page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def rank_pid(nb: NotebookPage, rank: int) -> int:
    status, session = nb.lab.call("GET", f"{DIST_API}/sessions/{SESSION}")
    assert status == 200, session
    return int(session["ranks"][rank]["pid"])


def debug_a_cell(nb: NotebookPage, console: Locator) -> None:
    """JupyterLab's debugger on the rank: turned on in the console's toolbar, a breakpoint
    set in the gutter of the prompt's editor pauses the cell there, the paused line is
    highlighted and the Variables panel shows a value, and Continue ends the cell."""
    from playwright.sync_api import expect

    content = console.locator(".jp-CodeConsole-content")
    bug = nb.page.locator(".jp-DebuggerBugButton").last
    expect(bug).to_be_enabled(timeout=RENDER_TIMEOUT_MS)  # the rank offers its debugger
    bug.click()
    expect(bug).to_have_attribute("aria-pressed", "true", timeout=RENDER_TIMEOUT_MS)
    nb.page.locator('.lm-TabBar-tab[data-id="jp-debugger-sidebar"]').click()
    sidebar = nb.page.locator(".jp-DebuggerSidebar")
    expect(sidebar).to_be_visible(timeout=RENDER_TIMEOUT_MS)

    prompt_cell = console.locator(".jp-CodeConsole-promptCell")
    editor = prompt_cell.locator(".cm-content")
    editor.click()
    expect(editor).to_be_focused(timeout=RENDER_TIMEOUT_MS)
    nb.page.keyboard.insert_text(DEBUGGED_CELL)
    expect(prompt_cell.locator(".cm-line")).to_have_count(3, timeout=RENDER_TIMEOUT_MS)
    gutter = prompt_cell.locator(".cm-gutter.cm-breakpoint-gutter").bounding_box()
    line = prompt_cell.locator(".cm-line").nth(2).bounding_box()
    assert gutter is not None and line is not None, "the prompt's editor is not shown"
    nb.page.mouse.click(gutter["x"] + gutter["width"] / 2, line["y"] + line["height"] / 2)
    marker = prompt_cell.locator('.cm-breakpoint-gutter [aria-label="Breakpoint"]')
    expect(marker).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("rank-console-debugger-breakpoint")
    editor.click()
    nb.page.keyboard.press("Shift+Enter")

    # paused on line 3: the line is highlighted, b's value is in the Variables panel
    paused = content.locator(".jp-DebuggerEditor-highlight")
    expect(paused).to_have_text("print('b is', b)", timeout=RENDER_TIMEOUT_MS)
    variables = sidebar.locator(".jp-DebuggerVariables-body:visible")
    name = variables.locator(".jp-DebuggerVariables-name", has_text=re.compile(r"^b$"))
    expect(name).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    expect(name.locator("xpath=..").locator(".jp-DebuggerVariables-detail")).to_have_text("42")
    expect(sidebar.locator(".jp-DebuggerCallstackFrame").first).to_be_visible()
    expect(content).not_to_contain_text("b is 42")
    nb.screenshot("rank-console-debugger-paused")

    sidebar.get_by_title(re.compile(r"^Continue")).click()
    expect(content).to_contain_text("b is 42", timeout=RENDER_TIMEOUT_MS)
    expect(paused).to_have_count(0)
    # JupyterLab showed the paused cell's source in a tab of its own: back to the console
    nb.page.locator(".lm-TabBar-tab", has_text=f"{SESSION} rank 1").click()
    nb.screenshot("rank-console-debugger-continued")
    # off again: a kernel that goes away (the restart below) while JupyterLab's debugger
    # waits for its answer to a request (it sends some a moment after each edit) makes
    # JupyterLab log an error, as it does for any kernel's restart
    bug.click()
    expect(bug).to_have_attribute("aria-pressed", "false", timeout=RENDER_TIMEOUT_MS)


def test_a_rank_console_interrupts_debugs_restarts_and_follows_its_session(
    open_lab_notebook: OpenNotebook,
) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "rank_console",
        [
            "%load_ext jupyter_dist",
            f"%%distributed --procs 2 --session {SESSION}\nx = 1",
            f"%%distributed --session {SESSION}\n"
            "import os, torch, torch.distributed as dist\n"
            "t = torch.ones(1); dist.all_reduce(t)\n"
            "print('x', globals().get('x'), 'sum', t.item(), 'pid', os.getpid())",
        ],
    )
    assert nb.run_all(), [nb.output(i).inner_text() for i in (1, 2)]
    show_sidebar(nb)
    card = session_card(nb, SESSION)
    expect(card.locator(".jp-DistBadge").first).to_have_text("ready", timeout=RENDER_TIMEOUT_MS)
    card.get_by_role("button", name=f"Open session {SESSION}").click()
    card.get_by_role("button", name="Show ranks 0-1 one by one").click()  # idle: folded
    card.locator('.jp-DistRank[data-rank="1"] button', has_text="console").click()
    console = nb.page.locator(".jp-CodeConsole").last
    expect(console).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    content = console.locator(".jp-CodeConsole-content")

    # Kernel > Interrupt while the rank sleeps: the sleep ends in KeyboardInterrupt
    nb.run_in_console(console, "import time; print('sleeping'); time.sleep(60)")
    expect(content).to_contain_text("sleeping", timeout=RENDER_TIMEOUT_MS)
    expect(console.locator(".jp-InputPrompt", has_text="[*]")).to_have_count(1)
    kernel_menu(nb, "Interrupt Kernel")
    expect(content).to_contain_text("KeyboardInterrupt", timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("rank-console-interrupted")
    # the other rank was left alone: it ran nothing, and is idle
    status, session = nb.lab.call("GET", f"{DIST_API}/sessions/{SESSION}")
    assert status == 200 and [r["state"] for r in session["ranks"]] == ["idle", "idle"], session

    # a collective typed here is refused before it blocks the rank
    nb.run_in_console(console, "import torch.distributed as dist; dist.barrier()")
    expect(content).to_contain_text("CollectiveInConsole", timeout=RENDER_TIMEOUT_MS)
    expect(content).to_contain_text("this console runs on rank 1 alone")
    nb.screenshot("rank-console-collective")

    debug_a_cell(nb, console)

    # the console's Restart, once JupyterLab asked: this rank alone restarts, the other
    # keeps its variables, one notice says so, and no second question comes
    old_pid, other_pid = rank_pid(nb, 1), rank_pid(nb, 0)
    nb.run_in_console(console, "y = 'only on rank 1'")
    expect(console.locator(".jp-InputPrompt", has_text="[*]")).to_have_count(0)
    kernel_menu(nb, "Restart Kernel")
    dialog = nb.page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Restart Kernel?", timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("rank-console-restart-question", dialog.locator(".jp-Dialog-content"))
    dialog.locator("button.jp-mod-accept").click()
    toasts = nb.page.locator(".Toastify")
    expect(toasts).to_contain_text(
        f"Rank 1 of {SESSION} restarted alone", timeout=RENDER_TIMEOUT_MS
    )
    expect(toasts).to_contain_text("the other rank kept its own")
    expect(nb.page.locator(".jp-Dialog")).to_have_count(0)  # asked once
    expect(toasts).not_to_contain_text("now runs on the restarted rank")  # said once
    nb.screenshot("rank-console-restarted-alone")
    new_pid = rank_pid(nb, 1)
    assert new_pid != old_pid and rank_pid(nb, 0) == other_pid
    nb.run_in_console(console, "import os; print('pid', os.getpid(), 'y' in dir())")
    expect(content).to_contain_text(f"pid {new_pid} False", timeout=RENDER_TIMEOUT_MS)
    expect(console.locator(".jp-CodeConsole-promptCell")).to_be_visible()
    # rank 0 kept the notebook's variable, and both ranks are in one new group
    assert nb.run_cell(2)
    expect(nb.output(2)).to_contain_text(
        f"[rank 0] x 1 sum 2.0 pid {other_pid}", timeout=RENDER_TIMEOUT_MS
    )
    expect(nb.output(2)).to_contain_text(f"[rank 1] x None sum 2.0 pid {new_pid}")
    nb.screenshot("rank-console-after-restart")

    # a restart from elsewhere: the console follows too
    assert nb.lab.call("POST", f"{DIST_API}/sessions/{SESSION}/restart", {})[0] == 200
    third_pid = rank_pid(nb, 1)
    expect(toasts.get_by_text("now runs on the restarted rank")).to_have_count(
        1, timeout=RENDER_TIMEOUT_MS
    )
    # back to it once it moved: JupyterLab asks a console's kernel for the debugger's state
    # as the console comes to the front, and logs an error if the kernel goes meanwhile
    nb.page.locator(".lm-TabBar-tab", has_text=f"{SESSION} rank 1").click()
    nb.run_in_console(console, "print('pid', os.getpid() if 'os' in dir() else 'fresh')")
    expect(content).to_contain_text("pid fresh", timeout=RENDER_TIMEOUT_MS)
    nb.run_in_console(console, "import os; print('now', os.getpid())")
    expect(content).to_contain_text(f"now {third_pid}", timeout=RENDER_TIMEOUT_MS)

    # shut down: the console closes, saying why
    assert nb.lab.call("DELETE", f"{DIST_API}/sessions/{SESSION}")[0] == 204
    expect(toasts).to_contain_text(
        f"The console on rank 1 of {SESSION} closed: session {SESSION} was shut down",
        timeout=RENDER_TIMEOUT_MS,
    )
    expect(nb.page.locator(".jp-CodeConsole")).to_have_count(0, timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("rank-console-closed")
    # JupyterLab's debugger asks a console's kernel for its state when the console gets it;
    # a kernel swapped away before answering cancels that ask, which the debugger logs
    assert nb.console_errors == []
