"""Notebook CPU per empty cell of several checkouts side by side, in blocks taken in turn.

    git worktree add ../before COMMIT
    .venv/bin/python bench/cell_cpu_trees.py before=../before after=. --ranks 32

`bench/scale.py` measures one checkout at a time, over 30 cells; on a shared 2-core machine
the load moves by half from one minute to the next, and so does its CPU per cell. Here
each checkout (a folder holding a ``jupyter_dist``: a git worktree of another commit, or
this one), named ``LABEL=FOLDER`` or by its folder's name, gets a notebook kernel of its
own (`notebook_kernel.NotebookKernel`, whose ``jupyter_dist`` is the checkout's) with a
session of ``--ranks`` local ranks (``--no-init``). Then, block after block, each kernel
runs ``--cells`` warm ``%%distributed`` ``x = 1`` cells and as many plain ``x = 1`` cells,
the checkouts taking turns (in reverse order every other block), so that each meets the
same load.

For each checkout: the notebook kernel's CPU per cell (user + system, every thread) of each
block, the plain cell's, the own part (the median of each block's difference), the median
round trip, and the batches its session's IOPub reader took per cell. Prints them and
writes bench/results/cell-cpu-trees-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from notebook_kernel import NotebookKernel, notebook_kernel

BENCH_DIR = Path(__file__).resolve().parent
CELL = "%%distributed\nx = 1"
PLAIN = "x = 1"
CELL_TIMEOUT_S = 600.0
#: the session's IOPub reader's counters, read in the notebook kernel
READER = """\
from jupyter_dist.notebook.owners import session_owner as _bench_owner
_bench_reader = _bench_owner().manager.sessions["default"]._iopub
print(_bench_reader.batches if _bench_reader is not None else 0)
"""


def block(nk: NotebookKernel, code: str, cells: int) -> tuple[float, float]:
    """CPU ms per cell and median round trip (ms) of ``cells`` runs of ``code``."""
    cpu0 = nk.cpu_seconds()
    times = [nk.run(code, timeout=CELL_TIMEOUT_S).elapsed for _ in range(cells)]
    return 1000 * (nk.cpu_seconds() - cpu0) / cells, 1000 * statistics.median(times)


def batches(nk: NotebookKernel) -> int:
    return int(nk.run(READER, timeout=CELL_TIMEOUT_S).stream().strip() or 0)


def summary(values: dict[str, list[float]], cells: int) -> dict[str, Any]:
    own = [a - b for a, b in zip(values["cpu"], values["plain_cpu"], strict=True)]
    return {
        "cpu_per_cell_ms": statistics.median(values["cpu"]),
        "plain_cell_cpu_ms": statistics.median(values["plain_cpu"]),
        "own_part_ms": statistics.median(own),
        "warm_median_ms": statistics.median(values["warm"]),
        "batches_per_cell": values["batches"][0] / (cells * len(values["cpu"])),
        "blocks": {k: v for k, v in values.items() if k != "batches"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "trees", nargs="+", help="checkouts (LABEL=FOLDER or FOLDER), each of this project"
    )
    p.add_argument("--ranks", type=int, default=32, help="local ranks of each session")
    p.add_argument("--blocks", type=int, default=10, help="blocks of cells a checkout")
    p.add_argument("--cells", type=int, default=40, help="cells of each kind a block")
    args = p.parse_args(argv)
    named = [t.split("=", 1) if "=" in t else [Path(t).resolve().name, t] for t in args.trees]
    labels = [label for label, _folder in named]
    trees = [Path(folder).resolve() for _label, folder in named]
    missing = [str(t) for t in trees if not (t / "jupyter_dist" / "__init__.py").is_file()]
    if missing:
        p.error(f"{', '.join(missing)}: expected checkouts of this project (no jupyter_dist)")
    if len(set(labels)) != len(labels):
        p.error(f"labels {', '.join(labels)}: expected each once (name them LABEL=FOLDER)")
    if not 1 <= args.ranks <= 256 or args.blocks < 1 or args.cells < 1:
        p.error("expected --ranks 1 to 256, and at least one block and cell")
    env = {"JUPYTER_DIST_MAX_RANKS_PER_NODE": str(args.ranks), "JUPYTER_DIST_OUTPUT": "widget"}
    results: dict[str, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        kernels = []
        for tree in trees:
            nk = stack.enter_context(notebook_kernel(tree, "%dist shutdown --all", extra_env=env))
            nk.run("%load_ext jupyter_dist", timeout=CELL_TIMEOUT_S)
            nk.run(f"%%distributed --procs {args.ranks} --no-init\nx = 1", timeout=CELL_TIMEOUT_S)
            for _ in range(5):
                nk.run(CELL, timeout=CELL_TIMEOUT_S)
                nk.run(PLAIN, timeout=CELL_TIMEOUT_S)
            kernels.append(nk)
        for label in labels:
            results[label] = {"cpu": [], "plain_cpu": [], "warm": [], "batches": [0.0]}
        for b in range(args.blocks):
            order = list(zip(labels, kernels, strict=True))
            for label, nk in order if b % 2 == 0 else order[::-1]:
                values = results[label]
                before = batches(nk)
                cpu, warm = block(nk, CELL, args.cells)
                values["batches"][0] += batches(nk) - before
                plain, _ = block(nk, PLAIN, args.cells)
                values["cpu"].append(cpu)
                values["plain_cpu"].append(plain)
                values["warm"].append(warm)
            line = ", ".join(f"{label}: {results[label]['cpu'][-1]:.2f}" for label in labels)
            print(f"[cell_cpu_trees] block {b + 1}: CPU per cell {line}", file=sys.stderr)
    out: dict[str, Any] = {
        "settings": {"ranks": args.ranks, "blocks": args.blocks, "cells": args.cells},
        "results": {t: summary(v, args.cells) for t, v in results.items()},
    }
    for label, s in out["results"].items():
        print(
            f"{label}: CPU per cell {s['cpu_per_cell_ms']:.2f} ms, plain cell "
            f"{s['plain_cell_cpu_ms']:.2f}, own part {s['own_part_ms']:.2f}, warm median "
            f"{s['warm_median_ms']:.1f} ms, {s['batches_per_cell']:.2f} IOPub batches a cell"
        )
    path = BENCH_DIR / "results" / f"cell-cpu-trees-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written to {path.relative_to(BENCH_DIR.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
