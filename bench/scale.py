"""How a cell's cost grows with the number of ranks: jupyter_dist beside ipyparallel.

    .venv/bin/python bench/scale.py                      # 2, 8, 32 and 64 local ranks
    .venv/bin/python bench/scale.py --ranks 2,8 --cells 20 --peers jupyter_dist

For each rank count N, in a real notebook kernel (`notebook_kernel.NotebookKernel`, as in
bench/run.py):

* **cold start**: a fresh kernel's first cell to its answer: jupyter_dist `%%distributed
  --procs N --no-init` running ``x = 1`` (ranks up, no process group), and with torch,
  ``--procs N`` doing an ``all_reduce`` (the process group of N ranks); ipyparallel
  ``Cluster(n=N).start_and_connect`` then a ``%%px`` cell.
* **warm cell**: ``x = 1`` on every rank, median and p90 of ``--cells`` round trips
  (request sent to reply and idle), shown as a notebook shows it (the widget view, whose
  snapshot is all a cell that quick shows; ``--output text`` for the text output).
* **notebook CPU per cell**: CPU time (user + system, every thread) of the notebook kernel
  process over those cells, divided by their number: the part that does not shrink when
  the ranks have CPUs of their own.
* **plain cell**: CPU per cell and median round trip of a plain ``x = 1`` cell in that
  kernel (no ranks): what IPython and ipykernel spend on any cell, the floor under both
  figures above. CPU per cell less this CPU is the peer's own part.
* **1 MB push**: a 1 MB numpy array sent to every rank (`%dist push a`,
  ``rc[:].push(..., block=True)``), median of 5.

Prints a markdown table (one row per N and peer, plus jupyter_dist / ipyparallel ratios)
and writes bench/results/scale-<time>.json. Targets (issue "2 to 1,024 ranks"): CPU per
empty cell at most 1.5 ms + 0.1 ms per rank at 32 ranks; warm cell at most 0.5x ipyparallel
at 2 ranks and 0.35x at 32; 1 MB push to 32 ranks at most 0.25x ipyparallel; cold start of
32 ranks to the first all_reduce under 4 s. A machine with fewer cores than ranks measures
the notebook side under load: compare peers within one run, never across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notebook_kernel import NotebookKernel, notebook_kernel

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PUSH_CODE = "import numpy as np\na = np.zeros(1 << 17)  # 1 MB of float64"
PUSH_REPEATS = 5
CELL_TIMEOUT_S = 600.0

IPP_START = """\
import ipyparallel as ipp
_bench_cluster = ipp.Cluster(n={n})
_bench_rc = await _bench_cluster.start_and_connect(activate=True)
"""
IPP_TEARDOWN = """\
if "_bench_cluster" in globals():
    await _bench_cluster.stop_cluster()
"""


def timed(nk: NotebookKernel, code: str) -> float:
    """Seconds of one cell, request to reply and idle; raises on an error."""
    result = nk.run(code, timeout=CELL_TIMEOUT_S)
    return float(result.elapsed)


def warm_cells(nk: NotebookKernel, cell: str, count: int) -> dict[str, float]:
    """Median/p90 round trip and the notebook kernel's CPU per cell over ``count`` cells."""
    for _ in range(3):
        timed(nk, cell)
    cpu0 = nk.cpu_seconds()
    times = [timed(nk, cell) for _ in range(count)]
    cpu = (nk.cpu_seconds() - cpu0) / count
    times.sort()
    return {
        "warm_median_ms": 1000 * statistics.median(times),
        "warm_p90_ms": 1000 * times[int(0.9 * (len(times) - 1))],
        "cpu_per_cell_ms": 1000 * cpu,
    }


def plain_cell_cpu(nk: NotebookKernel, count: int) -> dict[str, float]:
    """The notebook kernel's CPU for a plain ``x = 1`` cell (no ranks): what IPython and
    ipykernel spend on any cell, the floor under ``cpu_per_cell_ms``."""
    for _ in range(3):
        timed(nk, "x = 1")
    cpu0 = nk.cpu_seconds()
    times = [timed(nk, "x = 1") for _ in range(count)]
    return {
        "plain_cell_cpu_ms": 1000 * (nk.cpu_seconds() - cpu0) / count,
        "plain_median_ms": 1000 * statistics.median(times),
    }


def push_median(nk: NotebookKernel, push: str) -> float:
    nk.run(PUSH_CODE, timeout=CELL_TIMEOUT_S)
    return 1000 * statistics.median(timed(nk, push) for _ in range(PUSH_REPEATS))


def jupyter_dist(n: int, cells: int, env: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    with notebook_kernel(REPO_ROOT, "%dist shutdown --all", extra_env=env) as nk:
        nk.run("%load_ext jupyter_dist", timeout=CELL_TIMEOUT_S)
        out["cold_no_init_s"] = timed(nk, f"%%distributed --procs {n} --no-init\nx = 1")
        out.update(warm_cells(nk, "%%distributed\nx = 1", cells))
        out.update(plain_cell_cpu(nk, cells))
        out["push_1mb_ms"] = push_median(nk, "%dist push a")
    with notebook_kernel(REPO_ROOT, "%dist shutdown --all", extra_env=env) as nk:
        nk.run("%load_ext jupyter_dist", timeout=CELL_TIMEOUT_S)
        out["cold_all_reduce_s"] = timed(
            nk,
            f"%%distributed --procs {n}\nimport torch, torch.distributed as dist\n"
            "t = torch.ones(1)\ndist.all_reduce(t)",
        )
    return out


def ipyparallel(n: int, cells: int, env: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    with notebook_kernel(REPO_ROOT, IPP_TEARDOWN, extra_env=env) as nk:
        t0 = time.perf_counter()
        nk.run(IPP_START.format(n=n), timeout=CELL_TIMEOUT_S)
        nk.run("%%px\nx = 1", timeout=CELL_TIMEOUT_S)
        out["cold_no_init_s"] = time.perf_counter() - t0
        out.update(warm_cells(nk, "%%px\nx = 1", cells))
        out.update(plain_cell_cpu(nk, cells))
        out["push_1mb_ms"] = push_median(nk, "_bench_rc[:].push({'a': a}, block=True)")
    return out


PEERS: dict[str, Callable[[int, int, dict[str, str]], dict[str, float]]] = {
    "jupyter_dist": jupyter_dist,
    "ipyparallel": ipyparallel,
}
COLUMNS = (
    "cold_no_init_s",
    "cold_all_reduce_s",
    "warm_median_ms",
    "warm_p90_ms",
    "cpu_per_cell_ms",
    "plain_cell_cpu_ms",
    "plain_median_ms",
    "push_1mb_ms",
)


def table(results: dict[int, dict[str, dict[str, Any]]]) -> str:
    head = "| ranks | peer | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for n, peers in sorted(results.items()):
        for peer, values in peers.items():
            cells = [_fmt(values.get(c)) for c in COLUMNS]
            lines.append(f"| {n} | {peer} | " + " | ".join(cells) + " |")
        ours, theirs = peers.get("jupyter_dist", {}), peers.get("ipyparallel", {})
        ratios = []
        for c in COLUMNS:
            a, b = ours.get(c), theirs.get(c)
            both = isinstance(a, float) and isinstance(b, float) and b > 0
            ratios.append(f"{a / b:.2f}x" if both else "")
        if any(ratios):
            lines.append(f"| {n} | ratio | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return "" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", default="2,8,32,64", help="rank counts (default: 2,8,32,64)")
    p.add_argument("--peers", default=",".join(PEERS), help="jupyter_dist,ipyparallel")
    p.add_argument("--cells", type=int, default=30, help="timed warm cells per count")
    p.add_argument(
        "--output",
        choices=("widget", "text"),
        default="widget",
        help="jupyter_dist's cell output: the widget view a notebook shows (default), or text",
    )
    args = p.parse_args(argv)
    counts = [int(c) for c in args.ranks.split(",") if c.strip()]
    if not counts or min(counts) < 1 or max(counts) > 1024:
        p.error(f"--ranks {args.ranks!r}: expected counts between 1 and 1024, e.g. 2,8,32")
    peers = [s.strip() for s in args.peers.split(",") if s.strip()]
    unknown = [s for s in peers if s not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {', '.join(unknown)}; expected some of {', '.join(PEERS)}")
    if not 1 <= args.cells <= 10_000:
        p.error(f"--cells {args.cells}: expected 1 to 10000")
    # jupyter_dist refuses more ranks a node than twice the CPUs unless told
    env = {"JUPYTER_DIST_MAX_RANKS_PER_NODE": str(max(counts)), "JUPYTER_DIST_OUTPUT": args.output}
    results: dict[int, dict[str, dict[str, Any]]] = {}
    for n in counts:
        for peer in peers:
            print(f"[scale] {peer} with {n} ranks ...", file=sys.stderr, flush=True)
            try:
                values: dict[str, Any] = PEERS[peer](n, args.cells, env)
            except Exception as err:  # one failing count must not lose the others
                values = {"error": f"{type(err).__name__}: {err}"[:300]}
            results.setdefault(n, {})[peer] = values
    print(table(results))
    out = BENCH_DIR / "results" / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
    }
    settings = {"output": args.output, "cells": args.cells}
    out.write_text(
        json.dumps({"machine": machine, "settings": settings, "results": results}, indent=1)
    )
    print(f"\nwritten to {out.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
