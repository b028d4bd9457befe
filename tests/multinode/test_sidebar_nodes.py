"""The JupyterLab sidebar shows a two-node SSH session on the test suite's sshd nodes: both
nodes with their hosts, each node's ranks, and samples from each node's agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import (
    DIST_API,
    RENDER_TIMEOUT_MS,
    Lab,
    launch_chromium,
    missing_requirements,
    start_lab,
    stop_lab,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    problems = missing_requirements()
    if problems:
        pytest.skip("; ".join(problems))
    running = start_lab(tmp_path)
    try:
        yield running
    finally:
        stop_lab(running)


def test_the_sidebar_shows_both_nodes_of_an_ssh_session(lab: Lab, cluster: Any) -> None:
    from playwright.sync_api import expect, sync_playwright

    status, created = lab.call(
        "POST",
        f"{DIST_API}/sessions",
        {
            "name": "twonodes",
            "hosts": ",".join(cluster.hosts),
            "ssh_config": str(cluster.config_path),
            "procs": 2,
            "init": False,
        },
    )
    assert status == 201, created
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(lab.page_url("/lab", reset=""))
            tab = page.locator('.jp-SideBar [data-id="jupyter-dist-sidebar"]')
            expect(tab).to_be_visible(timeout=180_000)
            tab.click()
            card = page.locator('.jp-DistSession[data-session="twonodes"]')
            expect(card).to_contain_text("SSH", timeout=RENDER_TIMEOUT_MS)
            expect(card).to_contain_text("2 \u00d7 2 CPU")  # nodes x ranks
            card.get_by_role("button", name="Open session twonodes").click()
            hosts = card.locator(".jp-DistNode-host")
            expect(hosts).to_have_count(2)
            for i, host in enumerate(cluster.hosts):
                expect(hosts.nth(i)).to_contain_text(f"node {i}: {host}")
            # each node's agent answers the samples
            expect(card.locator(".jp-DistNode-metrics")).to_have_count(2, timeout=RENDER_TIMEOUT_MS)
            expect(card.locator('.jp-DistNode-metrics [role="meter"]').first).to_be_visible()
            page.screenshot(
                path=str(Path(__file__).parents[1] / "browser" / "output" / "sidebar-two-nodes.png")
            )
            browser.close()
    finally:
        assert lab.call("DELETE", f"{DIST_API}/sessions/twonodes")[0] == 204
