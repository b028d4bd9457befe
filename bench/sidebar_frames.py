"""The sidebar's frame times in Chromium while a 32-rank session streams its samples.

    .venv/bin/python bench/sidebar_frames.py                 # 32 CPU ranks, 1 Hz, 20 s
    .venv/bin/python bench/sidebar_frames.py --ranks 8 --seconds 10

Starts a real JupyterLab (the browser tests' `tests/browser/lab.py`), a session of
``--ranks`` CPU ranks through the REST API (no process group), opens the sidebar in
headless Chromium with the session unfolded and its ranks shown one by one (the heaviest
view: every rank's row, its CPU and memory, the node's meters), and records the time
between animation frames for ``--seconds`` while the metrics stream redraws the panel at
``--interval``. Target (issue "JupyterLab sidebar"): no frame over 50 ms. Prints a
markdown row and writes bench/results/sidebar-frames-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.lab import (  # noqa: E402
    DIST_API,
    launch_chromium,
    start_lab,
    stop_lab,
)

RESULTS = ROOT / "bench" / "results"
#: collects the gap between consecutive animation frames, in ms
FRAMES_JS = """seconds => new Promise(resolve => {
    const gaps = []; let last = performance.now(); const end = last + seconds * 1000;
    function tick(now) {
        gaps.push(now - last); last = now;
        if (now < end) requestAnimationFrame(tick); else resolve(gaps);
    }
    requestAnimationFrame(tick);
})"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    os.environ["JUPYTER_DIST_MAX_RANKS_PER_NODE"] = str(max(args.ranks, 8))
    workdir = RESULTS / "sidebar-frames-work"
    workdir.mkdir(parents=True, exist_ok=True)
    lab = start_lab(workdir)
    try:
        status, created = lab.call(
            "POST", f"{DIST_API}/sessions", {"name": "frames", "procs": args.ranks, "init": False}
        )
        assert status == 201, created
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(lab.page_url("/lab", reset=""))
            tab = page.locator('.jp-SideBar [data-id="jupyter-dist-sidebar"]')
            expect(tab).to_be_visible(timeout=180_000)
            tab.click()
            page.evaluate(
                "s => window.jupyterapp.commands.execute('apputils:change-theme', {theme: s})",
                "JupyterLab Light",
            )
            card = page.locator('.jp-DistSession[data-session="frames"]')
            expect(card).to_be_visible(timeout=60_000)
            card.get_by_role("button", name="Open session frames").click()
            card.locator(".jp-DistRank button", has_text="show").click()
            expect(card.locator(".jp-DistRank")).to_have_count(args.ranks, timeout=60_000)
            expect(card.locator(".jp-DistRank-usage").first).to_be_visible(timeout=60_000)
            time.sleep(2)
            gaps = page.evaluate(FRAMES_JS, args.seconds)
            browser.close()
        lab.call("DELETE", f"{DIST_API}/sessions/frames")
    finally:
        stop_lab(lab)
    gaps = gaps[1:]  # the first gap is from the call, not a frame
    worst = max(gaps)
    p99 = statistics.quantiles(gaps, n=100)[98]
    over = sum(1 for g in gaps if g > 50)
    print(
        "| ranks | interval | frames | median frame | p99 frame | worst frame | frames over 50 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.ranks} | {args.interval:g} s | {len(gaps)} | {statistics.median(gaps):.1f} ms "
        f"| {p99:.1f} ms | {worst:.1f} ms | {over} |"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"sidebar-frames-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "gaps_ms": gaps,
            }
        )
    )


if __name__ == "__main__":
    main()
