"""A notebook made from the Launcher, renamed with File > Rename, then Kernel > Restart: its
first ``%%distributed`` cell runs in the same session, on the same ranks with their
variables, and the page says so while the cell runs. A new notebook made meanwhile gets
the renamed one's old name (``Untitled.ipynb``) and a session of its own, and the sidebar
names each notebook as it is."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from jupyter_dist.server_client.discovery import notebook_session_name

from .conftest import VIEWPORT
from .lab import DIST_API, LOAD_TIMEOUT_S, RENDER_TIMEOUT_MS, RUN_TIMEOUT_S, Lab, NotebookPage

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

RENAMED = "trained.ipynb"

# The path of the notebook in the main area, once its kernel is idle and connected.
_ACTIVE_NOTEBOOK_JS = """() => {
    const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    if (!widget || !widget.context || !widget.sessionContext) return false;
    const kernel = widget.sessionContext.session && widget.sessionContext.session.kernel;
    if (!widget.context.isReady || !kernel) return false;
    if (kernel.status !== 'idle' || kernel.connectionStatus !== 'connected') return false;
    return {path: widget.context.path, id: widget.id, session: widget.sessionContext.path};
}"""

# Replace the notebook's cells with these code cells.
_SET_CELLS_JS = """([path, sources]) => {
    const app = window.jupyterapp;
    for (const widget of app.shell.widgets('main')) {
        if (!widget.context || widget.context.path !== path) continue;
        const shared = widget.content.model.sharedModel;
        shared.transact(() => {
            shared.deleteCellRange(0, shared.cells.length);
            shared.insertCells(0, sources.map(s => ({cell_type: 'code', source: s})));
        });
        return true;
    }
    return false;
}"""


@pytest.fixture
def page(chromium: Browser, lab: Lab) -> Iterator[Page]:
    context = chromium.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()
        lab.shutdown_kernels()


def menu_item(page: Page, menu: str, item: str) -> Locator:
    """``item`` of the menu bar's ``menu``, the menu opened."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).click()
    return page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$"))


def sessions(lab: Lab) -> list[dict[str, object]]:
    status, found = lab.call("GET", f"{DIST_API}/sessions")
    assert status == 200, found
    return list(found)


def session_named(lab: Lab, name: str) -> dict[str, object]:
    (found,) = [s for s in sessions(lab) if s["name"] == name]
    return found


def new_notebook_from_launcher(page: Page) -> dict[str, str]:
    """File > New Launcher, then the card of this test's kernel, as a person makes a
    notebook; the new notebook's path and panel once its kernel is idle."""
    menu_item(page, "File", "New Launcher").click()
    card = page.locator('.jp-LauncherCard[data-category="Notebook"]').filter(
        has_text="jupyter_dist tests"
    )
    card.last.click(timeout=LOAD_TIMEOUT_S * 1000)
    handle = page.wait_for_function(_ACTIVE_NOTEBOOK_JS, timeout=LOAD_TIMEOUT_S * 1000, polling=250)
    return dict(handle.json_value())


def test_a_renamed_notebook_keeps_its_session_through_kernel_restart(
    page: Page, lab: Lab, kernel_name: str
) -> None:
    from playwright.sync_api import expect

    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(f"uncaught: {err}"))
    page.goto(lab.page_url("/lab", reset=""), timeout=LOAD_TIMEOUT_S * 1000)

    # File > New from the Launcher: its card for this test's kernel makes Untitled.ipynb
    card = page.locator('.jp-LauncherCard[data-category="Notebook"]').filter(
        has_text="jupyter_dist tests"
    )
    card.click(timeout=LOAD_TIMEOUT_S * 1000)
    handle = page.wait_for_function(_ACTIVE_NOTEBOOK_JS, timeout=LOAD_TIMEOUT_S * 1000, polling=250)
    first = handle.json_value()
    assert first["path"].startswith("Untitled"), first
    nb = NotebookPage(page, lab, first["path"], first["id"])
    go = lab.root / "go-on"
    go.unlink(missing_ok=True)

    page.evaluate(
        _SET_CELLS_JS,
        [
            nb.path,
            [
                "%load_ext jupyter_dist",
                "%%distributed --procs 2\nimport os\nx = int(os.environ['RANK']) * 10\n"
                "print('x set to', x)",
            ],
        ],
    )
    assert nb.run_all(), "a cell failed before the rename"
    expect(nb.output(1)).to_contain_text("x set to 0", timeout=RENDER_TIMEOUT_MS)
    name = notebook_session_name({"JPY_SESSION_NAME": nb.path})
    (before,) = sessions(lab)
    assert before["name"] == name and before["notebook"] == nb.path, before
    pids = [r["pid"] for r in before["ranks"]]  # type: ignore[attr-defined]

    # File > Rename Notebook…, as a person does it: the dialog, a new name, Rename
    menu_item(page, "File", "Rename Notebook…").click()
    field = page.locator(".jp-Dialog input")
    field.fill(RENAMED)
    page.locator(".jp-Dialog .jp-mod-accept").click()
    page.wait_for_function(
        f"""() => {{
            const w = window.jupyterapp.shell.currentWidget;
            return !!w && w.context.path === {json.dumps(RENAMED)}
                && w.sessionContext.path === {json.dumps(RENAMED)};
        }}""",
        timeout=RENDER_TIMEOUT_MS,
        polling=250,
    )
    nb.path = RENAMED
    (renamed,) = sessions(lab)
    assert renamed["name"] == name and renamed["notebook"] == RENAMED, renamed
    assert [n["path"] for n in renamed["notebooks"]] == [RENAMED]  # type: ignore[attr-defined]
    # the sidebar's card of the session names the notebook by its new name
    page.locator('.jp-SideBar [data-id="jupyter-dist-sidebar"]').click()
    card = page.locator(f'#jupyter-dist-sidebar [data-session="{name}"]')
    expect(card.locator(".jp-DistSession-facts")).to_contain_text(
        RENAMED, timeout=RENDER_TIMEOUT_MS
    )
    nb.screenshot("rename-sidebar")

    # a new notebook gets the old name: another notebook, with a session of its own
    second = new_notebook_from_launcher(page)
    assert second["path"] == first["path"], (second, first)
    other = NotebookPage(page, lab, second["path"], second["id"])
    page.evaluate(
        _SET_CELLS_JS,
        [
            other.path,
            [
                "%load_ext jupyter_dist",
                "%%distributed --procs 1\nprint('sees the first notebook x:', 'x' in dir())",
            ],
        ],
    )
    assert other.run_all(), "the new notebook's cell failed"
    expect(other.output(1)).to_contain_text(
        "sees the first notebook x: False", timeout=RENDER_TIMEOUT_MS
    )
    fresh = f"{name}-2"  # its own name: the one made from its path is the renamed one's
    expect(other.output(1)).to_contain_text(f"session '{fresh}' ready")
    assert sorted(str(s["name"]) for s in sessions(lab)) == [name, fresh]
    mine = session_named(lab, fresh)
    assert mine["notebook"] == other.path, mine
    assert [n["path"] for n in mine["notebooks"]] == [other.path]  # type: ignore[attr-defined]
    renamed = session_named(lab, name)
    assert renamed["notebook"] == RENAMED, renamed
    assert [n["path"] for n in renamed["notebooks"]] == [RENAMED]  # type: ignore[attr-defined]
    # the sidebar: each card names its own notebook, used by it alone
    new_card = page.locator(f'#jupyter-dist-sidebar [data-session="{fresh}"]')
    expect(new_card.locator(".jp-DistSession-facts")).to_contain_text(
        other.path, timeout=RENDER_TIMEOUT_MS
    )
    expect(new_card.locator(".jp-DistSession-activity")).to_have_text(f"used by {other.path}")
    expect(card.locator(".jp-DistSession-facts")).to_contain_text(RENAMED)
    expect(card.locator(".jp-DistSession-facts")).not_to_contain_text(other.path)
    expect(card.locator(".jp-DistSession-activity")).to_have_text(f"used by {RENAMED}")
    other.screenshot("rename-new-notebook-sidebar")

    # back to the renamed notebook's tab; Kernel > Restart Kernel…, then the confirmation
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=RENAMED).click()
    page.wait_for_function(
        f"() => window.jupyterapp.shell.currentWidget.context.path === {json.dumps(RENAMED)}",
        timeout=RENDER_TIMEOUT_MS,
        polling=250,
    )
    menu_item(page, "Kernel", "Restart Kernel…").click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0, timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function(_ACTIVE_NOTEBOOK_JS, timeout=LOAD_TIMEOUT_S * 1000, polling=250)

    # the first %%distributed cell after the restart: it waits for go-on, so the page can
    # be looked at while it runs
    page.evaluate(
        _SET_CELLS_JS,
        [
            RENAMED,
            [
                "%load_ext jupyter_dist",
                "%%distributed\nimport os, time\n"
                f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                "print('x is still', x)",
            ],
        ],
    )
    nb.start_all()
    try:
        line = nb.output(1).get_by_text("its ranks kept their variables")
        expect(line).to_be_visible(timeout=RUN_TIMEOUT_S * 1000)
        expect(nb.output(1)).to_contain_text(f"attached to session {name!r}")
        # seen while the cell runs: its prompt says so, and its turn on the ranks comes
        expect(nb.cell(1).locator(".jp-InputPrompt")).to_contain_text("*")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while session_named(lab, name)["running"] is None:
            assert time.monotonic() < deadline, "the cell never took its turn on the ranks"
            time.sleep(0.1)
        expect(line).to_be_visible()
        nb.screenshot("rename-restart-running")
    finally:
        go.touch()
    assert nb.wait_all(), "the first cell after the restart failed"
    expect(nb.output(1)).to_contain_text("x is still 0", timeout=RENDER_TIMEOUT_MS)
    expect(nb.output(1).get_by_text("its ranks kept their variables")).to_be_visible()
    nb.screenshot("rename-restart-done")

    after = session_named(lab, name)  # the same session, no new one beside it
    assert sorted(str(s["name"]) for s in sessions(lab)) == [name, fresh]
    assert after["notebook"] == RENAMED, after
    assert [r["pid"] for r in after["ranks"]] == pids  # type: ignore[attr-defined]
    assert errors == []
    with contextlib.suppress(FileNotFoundError):
        go.unlink()
