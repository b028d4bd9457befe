"""What a burst of widget updates costs: an ipywidget set 400 times in a tight loop.

    .venv/bin/python bench/widget_burst.py                # 2 ranks, 5 rounds
    .venv/bin/python bench/widget_burst.py --ranks 4 --rounds 10

In one real notebook kernel (`notebook_kernel.NotebookKernel`, as in bench/run.py), each
cell body below runs as a plain cell (the notebook kernel itself: what a plain ipykernel
costs) and as a ``%%distributed`` cell on N local ranks in the widget view, the two taking
turns, round after round:

* ``updates``: ``bar.value = i``, 400 times;
* ``updates, printing``: the same, printing every tenth step (a training loop's log);
* ``updates and messages``: a custom widget message after each update too, so that no
  update is replaced by a later one before it is sent (`rank.superseded_updates`) and
  every message goes to the notebook at the pace the notebook reads them
  (`rank.iopub_credit`).

For each: the median round trip (request sent to reply and idle; min and max beside it)
and how many ``comm_msg`` messages the frontend was sent (the notebook kernel's IOPub, as
the browser gets it), and the ratio of the ``%%distributed`` cell to the plain one. A cell
that does not end within ``--timeout`` is interrupted, counted as taking that long, and
marked in the table.
Writes bench/results/widget-burst-<time>.json with every sample.
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
from typing import Any

from notebook_kernel import CellTimeout, NotebookKernel, notebook_kernel

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SETUP_TIMEOUT_S = 300.0
WARMUP_ROUNDS = 1
UPDATES = 400
TEARDOWN = "%dist shutdown --all\n"

_LOOP = (
    "import ipywidgets as w\n"
    f"bar = w.IntProgress(max={UPDATES})\n"
    "display(bar)\n"
    f"for i in range({UPDATES}):\n"
    "    bar.value = i\n"
)
BODIES = {
    "updates": _LOOP,
    "updates, printing": _LOOP + "    if i % 10 == 0:\n        print('step', i)\n",
    "updates and messages": _LOOP + "    bar.send({'step': i})\n",
}
KINDS = ("plain", "jupyter_dist")


def measure(n: int, rounds: int, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Round trips (seconds), comm_msg counts and time-outs of each body, plain and
    distributed."""
    samples: dict[str, dict[str, list[float]]] = {
        f"{body} / {kind}": {"s": [], "comm_msgs": [], "timed_out": []}
        for body in BODIES
        for kind in KINDS
    }
    with notebook_kernel(REPO_ROOT, TEARDOWN, extra_env=env) as nk:
        nk.run("%load_ext jupyter_dist", timeout=SETUP_TIMEOUT_S)
        nk.run(f"%%distributed --procs {n} --no-init\nx = 1", timeout=SETUP_TIMEOUT_S)
        for i in range(WARMUP_ROUNDS + rounds):
            for body, code in BODIES.items():
                for kind in KINDS:
                    cell = code if kind == "plain" else "%%distributed\n" + code
                    elapsed, comm_msgs, timed_out = _run(nk, cell, timeout)
                    print(f"round {i}: {body} / {kind}: {elapsed:.2f} s", file=sys.stderr)
                    if i >= WARMUP_ROUNDS:
                        sample = samples[f"{body} / {kind}"]
                        sample["s"].append(elapsed)
                        sample["comm_msgs"].append(comm_msgs)
                        sample["timed_out"].append(timed_out)
    return {
        name: {
            "median_s": statistics.median(s["s"]),
            "min_s": min(s["s"]),
            "max_s": max(s["s"]),
            "comm_msgs": statistics.median(s["comm_msgs"]),
            "timed_out": int(sum(s["timed_out"])),
        }
        for name, s in samples.items()
    } | {"samples": samples}


def _run(nk: NotebookKernel, cell: str, timeout: float) -> tuple[float, int, bool]:
    """The cell's round trip, the comm_msgs the frontend got, whether it timed out."""
    counted = [0]

    def count(msg: dict[str, Any], _at: float) -> bool:
        if msg["header"]["msg_type"] == "comm_msg":
            counted[0] += 1
        return False

    try:
        result = nk.run(cell, timeout=timeout, on_iopub=count)
    except CellTimeout:  # interrupted: a request that comes at once may be aborted
        nk.execute("pass", timeout=SETUP_TIMEOUT_S)
        return timeout, counted[0], True
    return float(result.elapsed), counted[0], False


def report(n: int, result: dict[str, Any]) -> str:
    lines = [
        f"### {UPDATES} updates a rank, {n} ranks",
        "",
        "| cell | plain: median s (min-max) | comm_msgs | jupyter_dist: median s (min-max) "
        "| comm_msgs | / plain |",
        "|---|---|---|---|---|---|",
    ]
    for body in BODIES:
        plain, dist = result[f"{body} / plain"], result[f"{body} / jupyter_dist"]
        lines.append(
            f"| {body} | {_time(plain)} | {plain['comm_msgs']:.0f} | {_time(dist)} "
            f"| {dist['comm_msgs']:.0f} | {dist['median_s'] / plain['median_s']:.1f}x |"
        )
    return "\n".join(lines)


def _time(s: dict[str, float]) -> str:
    shown = f"{s['median_s']:.2f} ({s['min_s']:.2f}-{s['max_s']:.2f})"
    return shown + (f", {s['timed_out']:.0f} timed out" if s["timed_out"] else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="local ranks (default: 2)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of the six cells")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a cell may take")
    args = p.parse_args(argv)
    if not 1 <= args.ranks <= 64:
        p.error(f"--ranks {args.ranks}: expected 1 to 64")
    if not 1 <= args.rounds <= 1000:
        p.error(f"--rounds {args.rounds}: expected 1 to 1000")
    if not 1 <= args.timeout <= 3600:
        p.error(f"--timeout {args.timeout}: expected 1 to 3600 seconds")
    env = {"JUPYTER_DIST_MAX_RANKS_PER_NODE": str(args.ranks), "JUPYTER_DIST_OUTPUT": "widget"}
    result = measure(args.ranks, args.rounds, args.timeout, env)
    print(report(args.ranks, result), flush=True)
    out_dir = BENCH_DIR / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"widget-burst-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "rounds": args.rounds}
    path.write_text(json.dumps({"settings": meta | {"ranks": args.ranks}, "results": result}))
    print(f"wrote {path.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
