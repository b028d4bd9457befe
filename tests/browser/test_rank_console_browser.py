"""A console on a rank, opened from the sidebar in a real JupyterLab: Kernel > Interrupt
stops the rank's running code, the console's Restart restarts that rank alone (asked once,
by JupyterLab), the console then runs on the new rank (after a restart from anywhere), a
collective typed there is refused unrun, and when the session is shut down the console
closes saying why."""

from __future__ import annotations

import pytest

from .lab import DIST_API, RENDER_TIMEOUT_MS, NotebookPage, OpenNotebook
from .test_sidebar_browser import session_card, show_sidebar

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
SESSION = "consoles"


def kernel_menu(nb: NotebookPage, item: str) -> None:
    nb.page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    nb.page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def rank_pid(nb: NotebookPage, rank: int) -> int:
    status, session = nb.lab.call("GET", f"{DIST_API}/sessions/{SESSION}")
    assert status == 200, session
    return int(session["ranks"][rank]["pid"])


def test_a_rank_console_interrupts_restarts_and_follows_its_session(
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

    # the console's Restart, once JupyterLab asked: this rank alone restarts, the other
    # keeps its variables, one notice says so, and no second question comes
    old_pid, other_pid = rank_pid(nb, 1), rank_pid(nb, 0)
    nb.run_in_console(console, "y = 'only on rank 1'")
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
    nb.page.locator(".lm-TabBar-tab", has_text=f"{SESSION} rank 1").click()  # back to it

    # a restart from elsewhere: the console follows too
    assert nb.lab.call("POST", f"{DIST_API}/sessions/{SESSION}/restart", {})[0] == 200
    third_pid = rank_pid(nb, 1)
    expect(toasts.get_by_text("now runs on the restarted rank")).to_have_count(
        1, timeout=RENDER_TIMEOUT_MS
    )
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
    ours = [e for e in nb.console_errors if "Could not restore the debugger state" not in e]
    assert ours == [], nb.console_errors
