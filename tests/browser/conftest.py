"""Browser fixtures: one JupyterLab and one headless Chromium for the whole run, a fresh
browser context per test, and leak checks after every test and at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING

import pytest

from tests.system_needs import require

from .lab import (
    Lab,
    NotebookPage,
    OpenNotebook,
    launch_chromium,
    missing_requirements,
    open_notebook,
    start_lab,
    stop_lab,
    write_notebook,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ViewportSize

VIEWPORT: ViewportSize = {"width": 1280, "height": 1000}
EXPECT_TIMEOUT_MS = 20_000
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def pytest_configure(config: pytest.Config) -> None:
    # under --strict-markers an unknown marker is an error; pyproject.toml may not name it
    if not any(line.startswith("browser") for line in config.getini("markers")):
        config.addinivalue_line(
            "markers", "browser: drives a real JupyterLab in headless Chromium (Playwright)"
        )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report, so a fixture knows whether its test failed."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


def require_browser() -> None:
    require("browser tests", missing_requirements())


@pytest.fixture(scope="package")
def lab(kernel_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A ``jupyter lab`` of this environment, token auth on; see ``lab.start_lab``."""
    require_browser()
    running = start_lab(tmp_path_factory.mktemp("lab"))
    try:
        yield running
    finally:
        leftovers = stop_lab(running)
    assert not leftovers, f"processes left after jupyter lab stopped: {leftovers}"


@pytest.fixture(scope="package")
def chromium() -> Iterator[Browser]:
    """Headless Chromium, driven by Playwright's sync API."""
    require_browser()
    from playwright.sync_api import expect, sync_playwright

    # what a person sees after a click may take seconds on a loaded 2-core machine (a
    # widget's round trip through a kernel that runs a cell, beside other tests' ranks):
    # an expectation waits up to this long (5 s by default); one that holds returns at once
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def open_lab_notebook(
    lab: Lab, chromium: Browser, kernel_name: str, request: pytest.FixtureRequest
) -> Iterator[OpenNotebook]:
    """``open_lab_notebook(name, cells)`` writes ``name.ipynb`` (code cells, this test's
    kernelspec) into the lab and opens it in a new page; see ``lab.NotebookPage``.

    Afterwards: a screenshot of each page if the test failed, then every kernel and
    jupyter_dist session of the lab is shut down and must leave no process behind.
    """
    context = chromium.new_context(viewport=VIEWPORT)
    pages: list[NotebookPage] = []

    def _open(name: str, cells: Sequence[str] | None) -> NotebookPage:
        path = lab.root / f"{name}.ipynb"
        if cells is not None:
            write_notebook(path, cells, kernel_name)
        nb = open_notebook(context.new_page(), lab, path.name)
        pages.append(nb)
        return nb

    try:
        yield _open
    finally:
        call = request.node.stash.get(REPORTS, {}).get("call")
        if call is None or call.failed:
            print(f"--- jupyter lab's log ---\n{lab.log_tail()}")
            for i, nb in enumerate(pages):
                print(f"--- page {i}: console errors ---", *nb.console_errors, sep="\n")
                with contextlib.suppress(Exception):  # a crashed page has no picture
                    nb.screenshot(f"{request.node.name}-failed-{i}")
        context.close()
        leftovers = lab.shutdown_kernels()
    assert not leftovers, f"processes left after the test's kernels were shut down: {leftovers}"
