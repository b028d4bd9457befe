"""Soak: 300 cells in a row on 4 ranks, in a real notebook kernel with its default output
(the widget cell view), with output, push/pull, and a rank error every 20 cells.

Afterwards the notebook kernel's processes (itself and every descendant: agent, ranks),
their threads and open files, and the notebook kernel's RSS must be back within 10% of
where they were. Numbers are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.manager import KernelManager

from jupyter_dist.display.cell_view import LIVE_VIEWS
from tests.conftest import kernel_process, ready_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RANKS = 4
#: cells before the baseline: every kind of cell, and enough to fill the window of live
#: cell views (older ones are retired), so that the baseline holds what stays
WARM_UP = max(20, LIVE_VIEWS + 10)
CELLS = 300
ERROR_EVERY = 20
#: how far from the baseline each count may end (10%)
TOLERANCE = 0.10
SEED = 20240607


class Notebook:
    """A notebook kernel driven as a frontend would drive it."""

    def __init__(self, km: KernelManager) -> None:
        self.km = km
        self.kc = ready_client(km)
        self.process = kernel_process(km)
        self.received = 0  # IOPub messages, as a frontend would see them
        self.text: list[str] = []

    def run(self, code: str, timeout: float = 300) -> dict[str, Any]:
        """Run a cell; return its execute_reply content, keeping what it printed."""
        self.text = []

        def hook(msg: dict[str, Any]) -> None:
            self.received += 1
            if msg["msg_type"] == "stream":
                self.text.append(msg["content"]["text"])

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return dict(reply["content"])

    def ok(self, code: str) -> str:
        reply = self.run(code)
        assert reply["status"] == "ok", (code, reply)
        return "".join(self.text)


def usage(root: psutil.Process) -> dict[str, int]:
    """Processes (the notebook kernel and all its descendants), their threads and open
    files, and the notebook kernel's RSS."""
    procs = [root, *root.children(recursive=True)]
    counts = {"processes": len(procs), "threads": 0, "fds": 0, "rss": root.memory_info().rss}
    for proc in procs:
        try:
            counts["threads"] += proc.num_threads()
            counts["fds"] += proc.num_fds()
        except psutil.Error:  # a zombie, or gone: still counted as a process
            pass
    return counts


def off_by(now: dict[str, int], base: dict[str, int]) -> dict[str, float]:
    return {k: (now[k] - base[k]) / base[k] for k in base}


@pytest.fixture
def notebook(kernel_name: str, tmp_path: Path) -> Iterator[Notebook]:
    km = KernelManager(kernel_name=kernel_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_DIST_OUTPUT")}
    km.start_kernel(cwd=str(tmp_path), env=env)
    nb = Notebook(km)
    try:
        yield nb
    finally:
        nb.run("%dist shutdown --all", timeout=120)
        nb.kc.stop_channels()
        km.shutdown_kernel(now=True)


def _cell(nb: Notebook, i: int, rng: random.Random) -> str:
    """Cell ``i`` of the soak: what kind it was."""
    if i % ERROR_EVERY == ERROR_EVERY - 1:
        bad = rng.randrange(RANKS)
        reply = nb.run(
            "%%distributed\n"
            f"print('cell {i} before the error')\n"
            f"if rank == {bad}:\n"
            f"    raise ValueError('soak error {i} on rank {bad}')\n"
        )
        assert reply["status"] == "error", reply
        assert reply["ename"] == "RanksFailed", reply
        assert f"rank {bad} failed" in reply["evalue"], reply["evalue"]
        assert f"ValueError: soak error {i} on rank {bad}" in reply["evalue"], reply["evalue"]
        return "error"
    kind = i % 5
    if kind == 1:  # push with %dist push, used on every rank
        nb.ok(f"payload = {{'cell': {i}, 'data': list(range(1000))}}\n%dist push payload")
        nb.ok(
            "%%distributed\n"
            f"assert payload['cell'] == {i} and sum(payload['data']) == 499500\n"
            "print('pushed', payload['cell'])"
        )
        return "push"
    if kind == 2:  # push with --push
        nb.ok(f"scale = {i}")
        nb.ok(
            "%%distributed --push scale\n"
            "t = torch.full((4,), float(scale))\n"
            "dist.all_reduce(t)\n"
            f"assert t[0].item() == {float(i * RANKS)}, t\n"
            "print('sum', t[0].item())"
        )
        return "--push"
    if kind == 3:  # pull
        nb.ok(f"%%distributed\nval = rank * 1000 + {i}")
        nb.ok(
            "pulled = %dist pull val\n"
            f"assert pulled == [r * 1000 + {i} for r in range({RANKS})], pulled"
        )
        return "pull"
    nb.ok(  # output and a collective
        "%%distributed\n"
        "t = torch.ones(1) * (rank + 1)\n"
        "dist.all_reduce(t)\n"
        f"for line in range(20):\n"
        f"    print('cell {i} line', line, 'sum', t.item())\n"
        "print('rank', rank, 'done', file=sys.stderr)"
    )
    return "output"


def test_300_cells_leave_no_processes_threads_files_or_memory_behind(
    notebook: Notebook,
) -> None:
    """The baseline is taken after a warm-up of `WARM_UP` cells (40) of every kind: the
    first cells import widgets, torch's collectives and cloudpickle and start the ranks'
    threads, and the notebook keeps the last `LIVE_VIEWS` cell views (30) as live widgets,
    so memory grows until that window is full. Then `CELLS` more cells run, and the counts
    must come back within `TOLERANCE` of the baseline (threads get a few seconds to wind
    down)."""
    nb = notebook
    nb.ok("%load_ext jupyter_dist")
    nb.ok(
        f"%%distributed --procs {RANKS}\n"
        "import sys, torch, torch.distributed as dist\nrank = dist.get_rank()"
    )
    rng = random.Random(SEED)
    kinds: dict[str, int] = {}
    started = time.monotonic()
    base: dict[str, int] = {}
    for i in range(WARM_UP + CELLS):
        if i == WARM_UP:
            time.sleep(2)
            base = usage(nb.process)
            print(f"\nbaseline after {WARM_UP} cells: {base}")
        kind = _cell(nb, i, rng)
        kinds[kind] = kinds.get(kind, 0) + 1
        if (i + 1) % 50 == 0:
            print(f"after {i + 1} cells ({time.monotonic() - started:.0f} s): {usage(nb.process)}")
    elapsed = time.monotonic() - started
    # the cell after the last error worked too
    nb.ok("%%distributed\nprint('still fine')")

    deadline = time.monotonic() + 20
    while True:
        now = usage(nb.process)
        drift = off_by(now, base)
        if all(abs(d) <= TOLERANCE for d in drift.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(
        f"{WARM_UP + CELLS} cells in {elapsed:.0f} s ({kinds}); {nb.received} IOPub messages\n"
        f"baseline {base}\nafter    {now}\n"
        "drift    " + ", ".join(f"{k} {d:+.1%}" for k, d in drift.items())
    )
    assert all(abs(d) <= TOLERANCE for d in drift.values()), (base, now)
