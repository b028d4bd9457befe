"""The sidebar shows a session's faults and recovery as they happen, in a real JupyterLab:
a rank killed makes the session "degraded" with the fault named and a Heal button; the
button replaces that rank alone ("healing", then "ready", the next group counted), the
notebook's next cell finds the survivor's variable kept; a resize shows the new shape."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from .lab import RENDER_TIMEOUT_MS, OpenNotebook
from .test_sidebar_browser import session_card, show_sidebar

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]
SESSION = "mend"


def test_a_killed_rank_shows_degraded_is_healed_from_the_panel_and_a_resize_shows(
    open_lab_notebook: OpenNotebook,
) -> None:
    from playwright.sync_api import expect

    nb = open_lab_notebook(
        "sidebar_heal",
        [
            "%load_ext jupyter_dist",
            f"%%distributed --procs 2 --session {SESSION}\n"
            "import os\nkept = 100 + int(os.environ['RANK'])",
            f"%%distributed --session {SESSION}\n"
            "import os\nprint('kept', os.environ['RANK'], globals().get('kept'))",
        ],
    )
    assert nb.run_cell(0) and nb.run_cell(1), "the first cells failed"
    show_sidebar(nb)
    card = session_card(nb, SESSION)
    badge = card.locator(".jp-DistSession-state")
    facts = card.locator(".jp-DistSession-facts")
    expect(badge).to_have_text("ready", timeout=RENDER_TIMEOUT_MS)
    expect(card.locator("button.jp-DistButton", has_text="Heal")).to_have_count(0)
    first_group = re.search(r"group (\d+)", facts.inner_text())
    generation = int(first_group.group(1)) if first_group else 0

    # rank 1 killed from outside, as the machine's OOM killer would
    status = nb.lab.call("GET", f"/jupyter-dist/api/v1/sessions/{SESSION}")[1]
    victim = next(r for r in status["ranks"] if r["rank"] == 1)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    expect(badge).to_have_text("degraded", timeout=RENDER_TIMEOUT_MS)
    expect(badge).to_have_class(re.compile(r"jp-mod-degraded"))
    expect(card.locator(".jp-DistSession-error")).to_contain_text("rank 1")
    heal = card.locator("button.jp-DistButton", has_text="Heal")
    expect(heal).to_be_visible()
    nb.screenshot("sidebar-heal-degraded", nb.page.locator("#jupyter-dist-sidebar"))

    # healed from the panel: sampled while it happens, never "ready" with a dead rank
    heal.click()
    seen: list[str] = []
    deadline = time.monotonic() + RENDER_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        text = badge.inner_text()
        if not seen or seen[-1] != text:
            seen.append(text)
        if text == "ready":
            break
        nb.page.wait_for_timeout(50)
    assert seen[-1] == "ready", seen
    assert set(seen) <= {"degraded", "healing", "ready"}, seen
    expect(facts).to_contain_text(f"group {generation + 1}")
    expect(card.locator(".jp-DistSession-error")).to_have_count(0)
    expect(heal).to_have_count(0)
    nb.screenshot("sidebar-heal-healed", nb.page.locator("#jupyter-dist-sidebar"))

    # the notebook's next cell: rank 0 kept its variable, rank 1 starts empty
    assert nb.run_cell(2), "the cell after the heal failed"
    said = " ".join(nb.output(2).inner_text().split())
    assert "kept 0 100" in said, said
    assert "kept 1 None" in said, said

    # resized to 3 ranks through the API: the panel shows the new shape and group
    code, reply = nb.lab.call(
        "POST", f"/jupyter-dist/api/v1/sessions/{SESSION}/resize", {"counts": [3]}
    )
    assert code == 200, reply
    expect(facts).to_contain_text("1 \u00d7 3 CPU", timeout=RENDER_TIMEOUT_MS)
    expect(facts).to_contain_text(f"group {generation + 2}")
    expect(badge).to_have_text("ready")
    card.get_by_role("button", name=f"Open session {SESSION}").click()
    expect(card.locator(".jp-DistRank-label")).to_have_text("ranks 0-2", timeout=RENDER_TIMEOUT_MS)
    nb.screenshot("sidebar-heal-resized", nb.page.locator("#jupyter-dist-sidebar"))
    ours = [e for e in nb.console_errors if "jupyter-dist" in e or "Dist" in e]
    assert not ours, ours
